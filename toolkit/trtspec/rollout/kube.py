"""``trtspec rollout --kube``: the rollout ConfigMap of a deployment
(``artifacts.rollout_kube``) read and patched through ``kubectl``, so the user's
kubeconfig (its context, credentials and exec plugins) decides how the API
server is reached. Every call goes through the one subprocess chokepoint
(``build.executor.run_subprocess``) as an argv list; a patch carries the
``resourceVersion`` it read and kubectl's "Error from server (Conflict)"
becomes ``rollout_kube.Conflict``, which ``rollout_kube.change`` retries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trtspec.artifacts.rollout_kube import (
    ConfigMapData,
    Conflict,
    KubeError,
    configmap_name,
    from_object,
    patch_body,
)
from trtspec.errors import StepFailed

KUBECTL = "kubectl"


@dataclass(frozen=True)
class KubeTarget:
    """Which deployment's rollout, in which cluster (``trtspec deploy k8s
    --name``; kubeconfig context; namespace)."""

    deployment: str
    namespace: str = "default"
    context: str | None = None

    @property
    def configmap(self) -> str:
        return configmap_name(self.deployment)


class KubectlConfigMap:
    def __init__(self, target: KubeTarget) -> None:
        self.target = target
        self.name = target.configmap
        self.namespace = target.namespace

    def argv(self, *verb: str) -> list[str]:
        context = ["--context", self.target.context] if self.target.context else []
        return [KUBECTL, *context, "--namespace", self.namespace, *verb]

    def _run(self, argv: list[str]) -> dict[str, Any]:
        from trtspec.build import executor  # looked up per call: tests replace it

        lines: list[str] = []
        try:
            executor.run_subprocess(argv, echo=lines.append)
        except StepFailed as exc:
            if "Error from server (Conflict)" in exc.message:
                raise Conflict(exc.message) from exc
            raise KubeError(
                f"kubectl could not reach the rollout ConfigMap "
                f"{self.namespace}/{self.name}: {exc.message}",
                "Check --context/--namespace, that `trtspec deploy k8s` manifests are "
                "applied, and that you may get and patch configmaps there.",
            ) from exc
        return _json_object(lines, argv)

    def get(self) -> ConfigMapData:
        return from_object(self._run(self.argv("get", "configmap", self.name, "--output", "json")))

    def patch(self, data: dict[str, str], resource_version: str) -> ConfigMapData:
        body = json.dumps(patch_body(data, resource_version), sort_keys=True)
        argv = self.argv(
            "patch", "configmap", self.name, "--type", "merge", "--patch", body, "--output", "json"
        )
        return from_object(self._run(argv))


def _json_object(lines: list[str], argv: list[str]) -> dict[str, Any]:
    """The JSON object kubectl printed (its stderr warnings arrive on the
    same stream, before or after it)."""
    text = "\n".join(lines)
    start = text.find("{")
    if start >= 0:
        try:
            obj, _ = json.JSONDecoder().raw_decode(text[start:])
            if isinstance(obj, dict):
                return obj
        except ValueError:
            pass
    raise KubeError(
        f"kubectl printed no JSON object ({' '.join(argv[:6])} …): {text[-300:]!r}",
        "Run the command by hand to see what kubectl says.",
    )
