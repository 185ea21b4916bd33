"""The report's measurement notes about external (OpenAI-compatible) arms:
which server each arm is and what it is compared with, where its acceptance
numbers come from (or why there are none), and what differs from the Triton
arms by construction (chat templates rendered by the server, outputs compared
as text). Read from ``summary["external"]`` (``run.json``) and the cells."""

from __future__ import annotations

from trtspec.artifacts.bench_run import Summary


def external_notes(summary: Summary) -> list[str]:
    external = summary.get("external") or {}
    arms = external.get("arms") or {}
    if not arms:
        return []
    notes = []
    for name, arm in arms.items():
        pair = f", compared with {arm['baseline']}" if arm.get("baseline") else " (a baseline)"
        line = f"external arm {name}: {arm.get('openai')} model {arm.get('model')}{pair}"
        if arm.get("baseline"):
            if arm.get("acceptance_counters"):
                line += (
                    f"; acceptance from {arm['acceptance_counters']} Prometheus counter "
                    f"deltas ({arm.get('metrics')}; server-wide counters: exact only while "
                    "nothing else sends it traffic)"
                )
            else:
                line += f"; acceptance unknown: {arm.get('acceptance_note') or 'no metrics'}"
        notes.append(line)
    chat = external.get("chat_routes") or []
    if chat:
        notes.append(
            "routes " + ", ".join(chat) + ": external arms send `messages` and the server "
            "renders its own chat template, so their prompt text is not byte-identical to the "
            "Triton arms' (rendered by trtspec with the target tokenizer's template)"
        )
    notes.append(
        "external arms' equality with their baseline at T=0 compares output text "
        "(the OpenAI API returns no token ids); TTFT is the first non-empty content "
        "delta, token counts come from the stream's usage chunk"
    )
    for cell in summary.get("cells") or []:
        if (
            cell.get("arm_kind") == "openai"
            and cell.get("speculative")
            and cell.get("acceptance_note")
            and cell.get("acceptance_source") is None
        ):
            notes.append(
                f"{cell['route']} {cell['variant']} {cell['load']}: acceptance "
                f"unknown: {cell['acceptance_note']}"
            )
    return notes
