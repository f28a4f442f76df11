"""optimum-intel's side of ``benchmarks.generate_cpu``, run in optimum-intel's own environment.

optimum-intel pins an older transformers, so it cannot share tunetree's environment: the
benchmark runs this file with that environment's Python as a long-lived process. It reads a
JSON request (the saved model's directory, the prompts as token ids and masks, generate's
keywords), loads the model with ``OVModelForCausalLM.from_pretrained(dir, export=True)`` the
ways asked, among five (f32 hint; f32 hint with an f32 KV cache, since OpenVINO's CPU plugin
otherwise keeps the cache in 8 bits whatever the hint; OpenVINO's default precision; 8-bit and
4-bit weight-only) and that environment's own eager model, and prints one JSON line: the
approaches loaded, their load times, the KV cache precision each compiled model reports, and
why any failed. Then it serves: each line on stdin names an approach and a prompt, and it runs that
``generate`` once and answers one JSON line with the seconds it took (measured here, so the
pipe costs nothing) and the tokens; a line with ``new`` asks for that many new tokens instead
of the request's (``--split`` times the prompt's first token so). A line that also gives
``tokens`` and ``out`` asks for the
approach's teacher-forced logits instead (the prompt, then those tokens one step at a time,
positions as ``generate`` passes them), written to ``out`` as a ``.npy`` file. The benchmark
starts one such worker per approach (the request's ``approaches``; all when empty) and calls
every worker, its own environment's included, from one cycled order, so each approach is timed
alone in its process under the same machine state. An empty line ends it. It imports nothing of
tunetree.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request", help="the JSON request file benchmarks.generate_cpu writes")
    request_path = parser.parse_args().request
    import numpy as np
    import torch
    from optimum.intel import OVModelForCausalLM, OVWeightQuantizationConfig
    from transformers import AutoModelForCausalLM

    request = json.loads(Path(request_path).read_text())
    directory = request["model_dir"]
    gen = request["gen"]
    only = set(request.get("approaches") or ())
    loads = {
        "eager (optimum env)": lambda: AutoModelForCausalLM.from_pretrained(directory).eval(),
        "optimum-intel f32": lambda: OVModelForCausalLM.from_pretrained(
            directory, export=True, ov_config={"INFERENCE_PRECISION_HINT": "f32"}
        ),
        "optimum-intel f32, f32 KV cache": lambda: OVModelForCausalLM.from_pretrained(
            directory,
            export=True,
            ov_config={"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"},
        ),
        "optimum-intel default": lambda: OVModelForCausalLM.from_pretrained(directory, export=True),
        "optimum-intel int8 weights": lambda: OVModelForCausalLM.from_pretrained(
            directory, export=True, quantization_config=OVWeightQuantizationConfig(bits=8)
        ),
        "optimum-intel int4 weights": lambda: OVModelForCausalLM.from_pretrained(
            directory, export=True, quantization_config=OVWeightQuantizationConfig(bits=4)
        ),
    }
    models, load_s, failed, kv_cache = {}, {}, {}, {}
    for name, load in loads.items():
        if only and name not in only:
            continue
        start = time.perf_counter()
        try:
            models[name] = load()
        except Exception as exc:  # an approach that fails is reported, the others still run
            failed[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        load_s[name] = time.perf_counter() - start
        kv_cache[name] = _kv_cache_precision(models[name])
    print(
        json.dumps(
            {"loaded": list(models), "load_s": load_s, "failed": failed, "kv_cache": kv_cache}
        ),
        flush=True,
    )
    prompts = {n: {k: torch.tensor(v) for k, v in p.items()} for n, p in request["prompts"].items()}
    for line in sys.stdin:
        if not line.strip():
            break
        asked = json.loads(line)
        model, inputs = models[asked["approach"]], prompts[asked["prompt"]]
        if "tokens" in asked:
            logits = _teacher_forced(model, inputs, torch.tensor(asked["tokens"]))
            np.save(asked["out"], logits.float().numpy())
            print(json.dumps({"out": asked["out"]}), flush=True)
            continue
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**inputs, **new_tokens(gen, asked.get("new")))
        seconds = time.perf_counter() - start
        print(json.dumps({"s": seconds, "tokens": out.tolist()}), flush=True)


def new_tokens(gen: dict, new: Any) -> dict:
    """``gen`` asking for ``new`` new tokens instead (a line's ``new``), else ``gen`` itself."""
    if new is None:
        return gen
    return {**gen, "max_new_tokens": int(new), "min_new_tokens": int(new)}


def _teacher_forced(model: Any, inputs: dict, tokens: Any) -> Any:
    """``model``'s logits over the prompt, then over ``tokens`` one step at a time."""
    import torch

    mask = inputs["attention_mask"]
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        out = model(
            input_ids=inputs["input_ids"], attention_mask=mask, position_ids=positions,
            use_cache=True,
        )  # fmt: skip
        logits = [out.logits]
        for step in range(tokens.shape[1] - 1):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            positions = positions[:, -1:] + 1
            out = model(
                input_ids=tokens[:, step : step + 1], attention_mask=mask,
                position_ids=positions, past_key_values=out.past_key_values, use_cache=True,
            )  # fmt: skip
            logits.append(out.logits)
    return torch.cat(logits, dim=1)


def _kv_cache_precision(model: object) -> str:
    """The KV cache precision an optimum-intel model's compiled OpenVINO model reports."""
    request = getattr(model, "request", None)
    compiled = getattr(request, "get_compiled_model", lambda: request)()
    try:
        return str(compiled.get_property("KV_CACHE_PRECISION"))
    except Exception:  # eager, or an optimum-intel version without the property
        return "-"


if __name__ == "__main__":
    main()
