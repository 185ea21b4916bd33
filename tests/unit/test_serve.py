"""Unit tests for ``trtspec.serve`` that need no running server: where
tritonserver is found (flag › PATH › /opt › wheel, with fake binaries), the
assembled backend folder, the environment for the wheel's stub, argv building
(single server and mpirun leader mode), the manifest closure behind
``--variant``, world-size detection, and the exact error messages."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import sysconfig
import threading
from pathlib import Path

import pytest

import trtspec
from trtspec.errors import ServerError
from trtspec.serve import (
    Server,
    TritonInstall,
    detect_world_size,
    engine_models,
    find_tritonserver,
    free_ports,
    leader_mode_argv,
    log_errors,
    prepare_backend_dir,
    remove_shm_regions,
    resolve_repo,
    server_argv,
    variant_models,
)
from trtspec.serve.access import exposure_warning, is_loopback, root_warning

PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _fake_wheel(site: Path, stub_versions: tuple[str, ...] = (PY,)) -> Path:
    """The layout of nvidia-pytriton's ``pytriton/tritonserver`` folder."""
    root = site / "pytriton" / "tritonserver"
    _executable(root / "bin" / "tritonserver")
    (root / "backends" / "python").mkdir(parents=True)
    (root / "backends" / "python" / "libtriton_python.so").write_bytes(b"\x7fELF fake")
    (root / "backends" / "python" / "triton_python_backend_utils.py").write_text("X = 1\n")
    for version in stub_versions:
        _executable(root / "python_backend_stubs" / version / "triton_python_backend_stub")
    (site / "nvidia_pytriton.libs").mkdir()
    return root


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    return {
        "flag": _executable(tmp_path / "flag" / "tritonserver"),
        "path": _executable(tmp_path / "pathdir" / "tritonserver"),
        "opt": _executable(tmp_path / "opt" / "bin" / "tritonserver").parent,
        "wheel": _fake_wheel(tmp_path / "site"),
        "cache": tmp_path / "cache",
    }


def _find(places: dict[str, Path], explicit=None, *, path=True, opt=True, wheel=True):
    return find_tritonserver(
        explicit,
        search_path=str(places["path"].parent) if path else "",
        opt_dir=places["opt"] if opt else places["cache"] / "no-opt",
        wheel_dir=places["wheel"] if wheel else None,
        cache_dir=places["cache"],
    )


# --- discovery order ---------------------------------------------------------


def test_flag_wins_over_everything(places) -> None:
    install = _find(places, places["flag"])
    assert (install.binary, install.source, install.backend_dir) == (
        places["flag"],
        "explicit",
        None,
    )


def test_path_wins_over_opt_and_wheel(places) -> None:
    install = _find(places)
    assert (install.binary, install.source) == (places["path"], "PATH")
    assert install.backend_dir is None


def test_opt_wins_over_wheel(places) -> None:
    install = _find(places, path=False)
    assert (install.binary, install.source) == (places["opt"] / "tritonserver", str(places["opt"]))


def test_wheel_is_the_last_resort_and_gets_its_setup(places) -> None:
    install = _find(places, path=False, opt=False)
    root = places["wheel"]
    assert (install.binary, install.source) == (root / "bin" / "tritonserver", "nvidia-pytriton")
    assert install.backend_dir is not None
    assert install.backend_dir.parent == places["cache"] / "triton-backends"
    ld = install.env["LD_LIBRARY_PATH"].split(":")
    assert ld[:2] == [
        sysconfig.get_config_var("LIBDIR"),
        str(root.parent.parent / "nvidia_pytriton.libs"),
    ]
    pythonpath = install.env["PYTHONPATH"].split(":")
    assert pythonpath[0] == str(Path(trtspec.__file__).resolve().parent.parent)
    assert str(root.parent.parent) in pythonpath


def test_flag_pointing_at_the_wheel_binary_gets_the_wheel_setup(places) -> None:
    install = _find(places, places["wheel"] / "bin" / "tritonserver")
    assert install.source == "explicit" and install.backend_dir is not None
    assert "LD_LIBRARY_PATH" in install.env


def test_nothing_found(places) -> None:
    with pytest.raises(ServerError) as err:
        _find(places, path=False, opt=False, wheel=False)
    no_opt = places["cache"] / "no-opt"
    assert err.value.message == (
        f"tritonserver not found on PATH, in {no_opt} or in the nvidia-pytriton wheel"
    )
    assert err.value.hint == (
        "run inside the Triton TRT-LLM container, `pip install nvidia-pytriton` "
        "(bundles a CPU-capable tritonserver), or pass the binary with --tritonserver"
    )


def test_flag_missing_file(places, tmp_path) -> None:
    with pytest.raises(ServerError) as err:
        _find(places, tmp_path / "nope")
    assert err.value.message == f"tritonserver binary not found: {tmp_path / 'nope'}"


def test_flag_not_executable(places, tmp_path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("")
    with pytest.raises(ServerError) as err:
        _find(places, plain)
    assert err.value.message == f"tritonserver binary is not executable: {plain}"
    assert err.value.hint == f"chmod +x {plain}"


def test_foreign_install_gets_only_trtspec_on_pythonpath(places, monkeypatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    install = _find(places)
    package_parent = Path(trtspec.__file__).resolve().parent.parent
    if package_parent.name in ("site-packages", "dist-packages"):
        assert install.env == {}
    else:
        assert install.env == {"PYTHONPATH": str(package_parent)}


def test_user_pythonpath_is_kept_after_ours(places, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/user/one")
    install = _find(places, path=False, opt=False)
    assert install.env["PYTHONPATH"].split(":")[-1] == "/user/one"


# --- the assembled backend folder -------------------------------------------


def test_backend_dir_holds_library_stub_and_path_hook(tmp_path) -> None:
    root = _fake_wheel(tmp_path / "site")
    folder = prepare_backend_dir(root, tmp_path / "cache")
    python = folder / "python"
    assert sorted(p.name for p in python.iterdir()) == [
        "_trtspec_stub_path.py",
        "libtriton_python.so",
        "triton_python_backend_stub",
        "triton_python_backend_utils.py",
    ]
    assert (python / "triton_python_backend_stub").stat().st_mode & stat.S_IXUSR
    utils = (python / "triton_python_backend_utils.py").read_text().splitlines()
    assert utils[0].startswith("import _trtspec_stub_path")
    assert utils[1:] == ["X = 1"]
    assert prepare_backend_dir(root, tmp_path / "cache") == folder


def test_path_hook_puts_pythonpath_first(tmp_path, monkeypatch) -> None:
    root = _fake_wheel(tmp_path / "site")
    python = prepare_backend_dir(root, tmp_path / "cache") / "python"
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "hooked.pth").write_text(str(tmp_path / "from_pth") + "\n")
    (tmp_path / "from_pth").mkdir()
    import subprocess

    out = subprocess.run(
        [
            sys.executable,
            "-I",
            "-c",
            f"import sys; sys.path.append({str(python)!r}); import _trtspec_stub_path; "
            "print(sys.path)",
        ],
        env={"PYTHONPATH": f"{extra}:/nonexistent"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = eval(out)  # a printed list of str
    assert path[:2] == [str(extra), "/nonexistent"]
    assert str(tmp_path / "from_pth") in path


def test_backend_dir_changes_when_the_wheel_does(tmp_path) -> None:
    root = _fake_wheel(tmp_path / "site")
    first = prepare_backend_dir(root, tmp_path / "cache")
    (root / "backends" / "python" / "libtriton_python.so").write_bytes(b"\x7fELF newer build")
    second = prepare_backend_dir(root, tmp_path / "cache")
    assert first != second
    assert (second / "python" / "libtriton_python.so").read_bytes() == b"\x7fELF newer build"


def test_concurrent_assembly_is_safe(tmp_path) -> None:
    root = _fake_wheel(tmp_path / "site")
    results: list[Path] = []
    errors: list[BaseException] = []

    def assemble() -> None:
        try:
            results.append(prepare_backend_dir(root, tmp_path / "cache"))
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=assemble) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(set(results)) == 1
    leftovers = [p.name for p in (tmp_path / "cache" / "triton-backends").iterdir()]
    assert leftovers == [results[0].name]


def test_wheel_without_a_stub_for_this_python(tmp_path) -> None:
    root = _fake_wheel(tmp_path / "site", stub_versions=("3.8", "3.9"))
    with pytest.raises(ServerError) as err:
        prepare_backend_dir(root, tmp_path / "cache")
    assert err.value.message == (
        f"the nvidia-pytriton wheel at {root} has no Python backend stub for Python {PY} "
        "(it has: 3.8, 3.9)"
    )


# --- argv --------------------------------------------------------------------


def test_server_argv_exact() -> None:
    assert server_argv(
        "/bin/tritonserver",
        "/r",
        host="127.0.0.1",
        http_port=1,
        grpc_port=2,
        metrics_port=3,
        backend_dir="/b",
        models=["a", "b"],
        extra_args=["--log-verbose=1"],
    ) == [
        "/bin/tritonserver",
        "--model-repository=/r",
        "--backend-directory=/b",
        "--http-address=127.0.0.1",
        "--http-port=1",
        "--grpc-address=127.0.0.1",
        "--grpc-port=2",
        "--metrics-address=127.0.0.1",
        "--metrics-port=3",
        "--model-control-mode=explicit",
        "--load-model=a",
        "--load-model=b",
        "--log-verbose=1",
    ]


def test_server_argv_without_models_loads_everything() -> None:
    argv = server_argv(
        "ts", "/r", host="0.0.0.0", http_port=8000, grpc_port=8001, metrics_port=8002
    )
    assert argv == [
        "ts",
        "--model-repository=/r",
        "--http-address=0.0.0.0",
        "--http-port=8000",
        "--grpc-address=0.0.0.0",
        "--grpc-port=8001",
        "--metrics-address=0.0.0.0",
        "--metrics-port=8002",
    ]


def test_leader_mode_argv_exact() -> None:
    common = [
        "--http-address=127.0.0.1",
        "--http-port=8000",
        "--grpc-address=127.0.0.1",
        "--grpc-port=8001",
        "--metrics-address=127.0.0.1",
        "--metrics-port=8002",
    ]
    assert leader_mode_argv(3, "/repo", engine_model="target") == [
        "mpirun",
        "--allow-run-as-root",
        "-n",
        "1",
        "tritonserver",
        "--model-repository=/repo",
        *common,
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix0_",
        ":",
        "-n",
        "1",
        "tritonserver",
        "--model-repository=/repo",
        *common,
        "--model-control-mode=explicit",
        "--load-model=target",
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix1_",
        ":",
        "-n",
        "1",
        "tritonserver",
        "--model-repository=/repo",
        *common,
        "--model-control-mode=explicit",
        "--load-model=target",
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix2_",
    ]


def test_leader_mode_with_variant_and_two_engines() -> None:
    argv = leader_mode_argv(
        2,
        "/repo",
        engine_model=["draft_x", "target_dte"],
        oversubscribe=True,
        models=["draft", "draft_x", "target_dte"],
        binary="/opt/ts",
    )
    assert argv[:3] == ["mpirun", "--allow-run-as-root", "--oversubscribe"]
    rank0, rank1 = " ".join(argv).split(" : ")
    assert "--load-model=draft --load-model=draft_x --load-model=target_dte" in rank0
    assert rank1.split("--model-control-mode=explicit ")[1].startswith(
        "--load-model=draft_x --load-model=target_dte --disable-auto-complete-config"
    )


def test_leader_mode_needs_two_ranks_and_an_engine() -> None:
    with pytest.raises(ValueError, match="world_size >= 2"):
        leader_mode_argv(1, "/repo", engine_model="target")
    with pytest.raises(ValueError, match="at least one engine model"):
        leader_mode_argv(2, "/repo", engine_model=[])


FAKE = TritonInstall(binary=Path("/x/tritonserver"), backend_dir=Path("/x/backends"))


def test_server_argv_uses_install_and_fixed_ports(tmp_path) -> None:
    server = Server(
        tmp_path,
        install=FAKE,
        http_port=18000,
        grpc_port=18001,
        metrics_port=18002,
        models=["m"],
        extra_args=["--strict-readiness=true"],
    )
    assert server.argv() == [
        "/x/tritonserver",
        f"--model-repository={server.view_dir}",
        "--backend-directory=/x/backends",
        "--http-address=127.0.0.1",
        "--http-port=18000",
        "--grpc-address=127.0.0.1",
        "--grpc-port=18001",
        "--metrics-address=127.0.0.1",
        "--metrics-port=18002",
        "--disable-auto-complete-config",
        "--strict-readiness=true",
        "--http-restricted-api=model-repository,shared-memory,logging,trace:"
        "Trtspec-Closed=closed\nno-client-can-send-this",
        "--grpc-restricted-protocol=model-repository,shared-memory,logging,trace:"
        "Trtspec-Closed=closed\nno-client-can-send-this",
        f"--backend-config=python,shm-region-prefix-name={server.shm_prefix}",
    ]
    # models= is a repository view of exactly those models; model control stays off
    assert server.argv()[1] == f"--model-repository={server.view_dir}"
    assert server.view_dir.parent == server.runtime_dir
    assert server.runtime_dir.name.startswith(f"trtspec-server-{os.getpid()}-")
    assert server.shm_prefix.startswith(f"trtspec_{os.getpid()}_")
    assert server.grpc_url == "127.0.0.1:18001"
    assert server.endpoints()["http"] == "http://127.0.0.1:18000"


def test_port_zero_picks_distinct_free_ports(tmp_path) -> None:
    server = Server(tmp_path, install=FAKE, grpc_port=18001)
    server.argv()
    assert server.grpc_port == 18001
    assert len({server.http_port, server.grpc_port, server.metrics_port}) == 3
    assert len(set(free_ports(5))) == 5


def test_all_interfaces_are_reached_through_loopback(tmp_path) -> None:
    server = Server(
        tmp_path, install=FAKE, host="0.0.0.0", http_port=1, grpc_port=2, metrics_port=3
    )
    assert "--grpc-address=0.0.0.0" in server.argv()
    assert (server.http_url, server.grpc_url) == ("127.0.0.1:1", "127.0.0.1:2")


def test_world_size_builds_leader_mode(tmp_path) -> None:
    server = Server(
        tmp_path,
        install=FAKE,
        http_port=1,
        grpc_port=2,
        metrics_port=3,
        world_size=2,
        engine_models=["target"],
    )
    argv = server.argv()
    assert argv[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"]
    assert argv.count("/x/tritonserver") == 2 and "--load-model=target" in argv
    # one shared-memory prefix per rank, all under this server's own prefix
    assert [a for a in argv if "shm-region-prefix-name" in a] == [
        f"--backend-config=python,shm-region-prefix-name={server.shm_prefix}{rank}_"
        for rank in range(2)
    ]


def test_every_server_gets_its_own_shm_prefix_unless_given_one(tmp_path) -> None:
    a, b = Server(tmp_path, install=FAKE), Server(tmp_path, install=FAKE)
    assert a.shm_prefix and b.shm_prefix and a.shm_prefix != b.shm_prefix
    mine = "--backend-config=python,shm-region-prefix-name=mine_"
    own = Server(tmp_path, install=FAKE, extra_args=[mine])
    assert own.shm_prefix is None
    assert [x for x in own.argv() if "shm-region" in x] == [mine]


def test_remove_shm_regions_takes_only_the_prefix(tmp_path) -> None:
    for name in ("trtspec_1_ab_x", "trtspec_1_ab_y", "trtspec_1_abc_z", "triton_python_other"):
        (tmp_path / name).write_bytes(b"")
    assert remove_shm_regions("trtspec_1_ab_", tmp_path) == ["trtspec_1_ab_x", "trtspec_1_ab_y"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["triton_python_other", "trtspec_1_abc_z"]
    assert remove_shm_regions("", tmp_path) == []
    assert remove_shm_regions("x", tmp_path / "missing") == []


def test_missing_repository(tmp_path) -> None:
    with pytest.raises(ServerError) as err:
        Server(tmp_path / "nope", install=FAKE)
    assert err.value.message == f"model repository not found: {tmp_path / 'nope'}"
    assert err.value.hint == "pass the folder `trtspec repo` wrote (e.g. triton_repo/<spec>)"


def test_addresses_before_start(tmp_path) -> None:
    server = Server(tmp_path, install=FAKE)
    with pytest.raises(ServerError, match="tritonserver has not been started"):
        _ = server.grpc_url
    assert server.stop() is None and not server.running


# --- manifest closure ---------------------------------------------------------


def _manifest(repo: Path, models: dict, variants: list[str], **extra) -> None:
    repo.mkdir(parents=True, exist_ok=True)
    data = {
        "schema_version": 1,
        "spec": "s",
        "backend": "reference",
        "models": models,
        "variants": variants,
        **extra,
    }
    (repo / "trtspec-repo.json").write_text(json.dumps(data))


MODELS = {
    "preprocessing": {"role": "preprocessing", "calls": []},
    "postprocessing": {"role": "postprocessing", "calls": []},
    "target": {"role": "engine", "calls": []},
    "target_dte": {"role": "engine", "calls": []},
    "draft_tiny": {"role": "engine", "calls": []},
    "baseline": {
        "role": "orchestrator",
        "variant": "baseline",
        "calls": ["preprocessing", "target", "postprocessing"],
    },
    "draft": {
        "role": "orchestrator",
        "variant": "draft",
        "calls": ["preprocessing", "draft_tiny", "target_dte", "postprocessing"],
    },
    "router": {"role": "router", "calls": ["baseline", "draft"]},
}


def test_variant_closure(tmp_path) -> None:
    _manifest(tmp_path, MODELS, ["draft", "baseline"])
    assert variant_models(tmp_path, "draft") == [
        "draft",
        "draft_tiny",
        "postprocessing",
        "preprocessing",
        "target_dte",
    ]
    assert variant_models(tmp_path, "baseline") == [
        "baseline",
        "postprocessing",
        "preprocessing",
        "target",
    ]
    assert engine_models(tmp_path, variant_models(tmp_path, "draft")) == [
        "draft_tiny",
        "target_dte",
    ]


def test_unknown_variant_lists_valid_ones(tmp_path) -> None:
    _manifest(tmp_path, MODELS, ["draft", "baseline"])
    with pytest.raises(ServerError) as err:
        variant_models(tmp_path, "medusa")
    assert err.value.message == (
        f"{tmp_path / 'trtspec-repo.json'}: unknown variant 'medusa'; "
        "valid variants: draft, baseline"
    )
    assert err.value.hint == "pass one of the valid variants to --variant"


def test_dangling_call_names_the_caller(tmp_path) -> None:
    models = {**MODELS, "draft": {**MODELS["draft"], "calls": ["ghost"]}}
    _manifest(tmp_path, models, ["draft", "baseline"])
    with pytest.raises(ServerError) as err:
        variant_models(tmp_path, "draft")
    assert err.value.message == (
        f"{tmp_path / 'trtspec-repo.json'}: models.draft.calls: 'ghost' is not a model in the "
        "manifest"
    )


def test_manifest_missing(tmp_path) -> None:
    with pytest.raises(ServerError) as err:
        variant_models(tmp_path, "draft")
    assert err.value.message == (
        f"{tmp_path / 'trtspec-repo.json'}: not found; --variant needs the manifest that "
        "`trtspec repo` writes"
    )


def test_manifest_not_json(tmp_path) -> None:
    (tmp_path / "trtspec-repo.json").write_text("{oops")
    with pytest.raises(ServerError) as err:
        variant_models(tmp_path, "draft")
    assert err.value.message == (
        f"{tmp_path / 'trtspec-repo.json'}: not a readable JSON manifest: Expecting property "
        "name enclosed in double quotes: line 1 column 2 (char 1)"
    )


def test_manifest_wrong_schema_version(tmp_path) -> None:
    _manifest(tmp_path, MODELS, ["draft"], schema_version=2)
    with pytest.raises(ServerError) as err:
        variant_models(tmp_path, "draft")
    assert err.value.message == (
        f"{tmp_path / 'trtspec-repo.json'}: schema_version: 2 is not supported "
        "(this trtspec reads 1)"
    )


def test_manifest_without_models(tmp_path) -> None:
    (tmp_path / "trtspec-repo.json").write_text('{"schema_version": 1}')
    with pytest.raises(ServerError) as err:
        variant_models(tmp_path, "draft")
    assert err.value.message == (
        f"{tmp_path / 'trtspec-repo.json'}: models: missing or not an object"
    )


GOLDEN = Path(__file__).parent.parent / "golden" / "repo" / "qwen2.5-7b"


def test_closure_of_a_repository_trtspec_repo_wrote() -> None:
    assert variant_models(GOLDEN, "draft") == [
        "draft",
        "draft_qwen2.5-0.5b-instruct",
        "postprocessing",
        "preprocessing",
        "target_dte",
    ]
    assert variant_models(GOLDEN, "lookahead") == [
        "lookahead",
        "postprocessing",
        "preprocessing",
        "target_lookahead_lookahead",
    ]


def test_resolve_repo_descends_into_the_one_spec_repository(tmp_path) -> None:
    _manifest(tmp_path / "triton_repo" / "spec_a", MODELS, ["draft"])
    assert resolve_repo(tmp_path / "triton_repo") == tmp_path / "triton_repo" / "spec_a"
    assert resolve_repo(tmp_path / "triton_repo" / "spec_a") == tmp_path / "triton_repo" / "spec_a"
    plain = tmp_path / "plain"
    plain.mkdir()
    assert resolve_repo(plain) == plain


def test_resolve_repo_with_several_spec_repositories(tmp_path) -> None:
    for name in ("spec_b", "spec_a"):
        _manifest(tmp_path / "triton_repo" / name, MODELS, ["draft"])
    with pytest.raises(ServerError) as err:
        resolve_repo(tmp_path / "triton_repo")
    assert err.value.message == (
        f"{tmp_path / 'triton_repo'} holds 2 model repositories: spec_a, spec_b"
    )
    assert err.value.hint == f"pass one of them, e.g. {tmp_path / 'triton_repo' / 'spec_a'}"


# --- world size --------------------------------------------------------------


def _trtllm_repo(repo: Path, engines: dict[str, tuple[int, int]]) -> None:
    models = {name: {"role": "engine", "calls": []} for name in engines}
    _manifest(repo, models, ["baseline"], backend="tensorrt_llm")
    for name, (tp, pp) in engines.items():
        engine = repo.parent / "engines" / name
        engine.mkdir(parents=True)
        (engine / "config.json").write_text(
            json.dumps(
                {
                    "pretrained_config": {
                        "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp}
                    }
                }
            )
        )
        (repo / name).mkdir()
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "tensorrtllm"\n'
            f'parameters {{ key: "gpt_model_path" value {{ string_value: "{engine}" }} }}\n'
        )


def test_world_size_from_engine_config(tmp_path) -> None:
    _trtllm_repo(tmp_path / "repo", {"target": (2, 2), "draft_x": (2, 2)})
    assert detect_world_size(tmp_path / "repo") == 4


def test_world_size_mismatch(tmp_path) -> None:
    _trtllm_repo(tmp_path / "repo", {"target": (2, 1), "draft_x": (1, 1)})
    with pytest.raises(ServerError) as err:
        detect_world_size(tmp_path / "repo")
    assert err.value.message == (
        f"{tmp_path / 'repo'}: engine models need different TP×PP world sizes ([1, 2]); "
        "one leader-mode launch runs one world size"
    )


def test_world_size_is_one_without_trtllm_engines(tmp_path) -> None:
    assert detect_world_size(tmp_path) == 1
    _manifest(tmp_path, MODELS, ["draft"])
    assert detect_world_size(tmp_path) == 1


# --- log errors --------------------------------------------------------------


def test_log_errors_first_lines_load_failures_first() -> None:
    log = "\n".join(
        [
            'E1129 15:30:35.747426 4821 server.cc:241] "CudaDriverHelper has not been '
            'initialized."',
            "Error: Failed to initialize NVML",
            'E1129 15:32:55.1 5663 model.cc:1] "ERROR: Failed to create instance: '
            'boom\\n\\nAt:\\n x"',
            "E1129 15:32:55.2 5663 model_lifecycle.cc:654] \"failed to load 'm' version 1: "
            'Internal: boom\\n\\nAt:\\n  x"',
            'I1129 15:32:56.914223 5663 server.cc:305] "Waiting"',
            "error: creating server: Internal - failed to load all models",
        ]
    )
    assert log_errors(log) == [
        "failed to load 'm' version 1: Internal: boom",
        "error: creating server: Internal - failed to load all models",
        "ERROR: Failed to create instance: boom",
    ]


# --- start failures before any server runs -------------------------------------


def test_missing_mpirun_is_reported(tmp_path) -> None:
    server = Server(
        tmp_path,
        install=FAKE,
        world_size=2,
        engine_models=["target"],
        env={"PATH": str(tmp_path)},
        log_path=tmp_path / "s.log",
    )
    with pytest.raises(ServerError) as err:
        server.start(timeout=5)
    assert err.value.message == "cannot start mpirun: No such file or directory"
    assert err.value.hint == "install Open MPI (the Triton TRT-LLM container ships it)"
    assert not server.running


def test_vanished_binary_is_reported(tmp_path) -> None:
    install = TritonInstall(binary=tmp_path / "gone")
    server = Server(tmp_path, install=install, log_path=tmp_path / "s.log")
    with pytest.raises(ServerError) as err:
        server.start(timeout=5)
    assert err.value.message == f"cannot start {tmp_path / 'gone'}: No such file or directory"


def test_unwritable_log_is_reported(tmp_path) -> None:
    (tmp_path / "file").write_text("")
    log = tmp_path / "file" / "s.log"
    server = Server(tmp_path, install=FAKE, log_path=log)
    with pytest.raises(ServerError) as err:
        server.start(timeout=5)
    assert err.value.message == f"cannot write the server log {log}: File exists"
    assert err.value.hint == "pick another log file (--log-file)"


def test_deadline_kills_the_whole_group_once(tmp_path, monkeypatch) -> None:
    from trtspec.serve import supervisor

    # A "server" that never answers HTTP and has a child of its own, like the stubs.
    script = tmp_path / "fake_server"
    script.write_text("#!/bin/sh\nsleep 30 &\nwait\n")
    script.chmod(0o755)
    server = Server(tmp_path, install=TritonInstall(binary=script), log_path=tmp_path / "s.log")
    with pytest.raises(ServerError) as err:
        server.start(timeout=0.3)
    assert err.value.message.startswith("tritonserver was not ready after 0.3 s\n")
    assert err.value.hint == f"full log: {tmp_path / 's.log'}"
    assert server.pid is not None and supervisor.group_members(server.pid) == []
    signals: list[int] = []
    monkeypatch.setattr(supervisor, "_signal_group", lambda pgid, sig: signals.append(sig))
    assert server.stop() == server.poll() is not None
    assert signals == []  # torn down already: the group number may be someone else's now


def test_no_server_has_a_key_on_its_command_line(tmp_path) -> None:
    """Issue 28: a key on the command line is every local user's key. A
    server has no model control and closes the restricted APIs with a value
    no client can send; only control=True (tests) holds a key."""
    a, b = Server(tmp_path, install=FAKE), Server(tmp_path, install=FAKE, models=["m"])
    for server in (a, b):
        argv = server.argv()
        assert server.admin_key is None and server.admin_headers() == {}
        assert not [x for x in argv if x.startswith(("--model-control-mode", "--load-model"))]
        assert [x.split(":", 1)[1] for x in argv if "restricted" in x] == [
            "Trtspec-Closed=closed\nno-client-can-send-this"
        ] * 2
    with pytest.raises(ServerError) as err:
        b.load_model("m")
    assert err.value.message.startswith(
        "loading model 'm' failed: this server has no model control"
    )
    # leader mode: every rank closes the same APIs
    ranks = Server(
        tmp_path,
        install=FAKE,
        http_port=1,
        grpc_port=2,
        metrics_port=3,
        world_size=2,
        engine_models=["target"],
    )
    assert [a for a in ranks.argv() if a.startswith("--grpc-restricted-protocol=")] == [
        "--grpc-restricted-protocol=model-repository,shared-memory,logging,trace:"
        "Trtspec-Closed=closed\nno-client-can-send-this"
    ] * 2
    # control=True (tests that unload a model): explicit mode and a random key
    c = Server(tmp_path, install=FAKE, control=True)
    d = Server(tmp_path, install=FAKE, models=["m"], control=True)
    assert c.admin_key and d.admin_key and c.admin_key != d.admin_key
    assert re.fullmatch(r"[0-9a-f]{32}", d.admin_key)
    assert d.admin_headers() == {"trtspec-admin-key": d.admin_key}
    assert d.admin_headers("grpc") == {"triton-grpc-protocol-trtspec-admin-key": d.admin_key}
    assert "--model-control-mode=explicit" in c.argv() and "--load-model=*" in c.argv()
    assert [x for x in d.argv() if "load-model" in x] == ["--load-model=m"]
    assert f"--model-repository={tmp_path}" in d.argv()
    # a caller with its own restriction policy keeps it, and gets no key from us
    mine = "--http-restricted-api=model-repository:k=v"
    own = Server(tmp_path, install=FAKE, extra_args=[mine])
    assert own.admin_key is None and own.admin_headers() == {}
    assert [x for x in own.argv() if "restricted" in x] == [mine]
    with pytest.raises(ValueError):
        d.admin_headers("sagemaker")


def test_root_warning() -> None:
    assert root_warning(1000) is None
    assert root_warning(0) == (
        "Warning: tritonserver will run as root: a model that misbehaves (a Python backend "
        "model runs arbitrary code) does so with root's rights. Run trtspec as an unprivileged "
        "user (in a container: `USER` in the image, or `docker run --user`)."
    )


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.7", False),
        ("gpu-box.example", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
    assert (exposure_warning(host, 1, 2, 3) is None) is loopback
