"""optimum-intel's side of ``benchmarks.generate_cpu``, run in optimum-intel's own environment.

optimum-intel pins an older transformers, so it cannot share tunetree's environment: the
benchmark runs this file with that environment's Python as a long-lived process. It reads a
JSON request (the saved model's directory, the prompts as token ids and masks, generate's
keywords), loads the model with ``OVModelForCausalLM.from_pretrained(dir, export=True)`` five
ways (f32 hint; f32 hint with an f32 KV cache, since OpenVINO's CPU plugin otherwise keeps the
cache in 8 bits whatever the hint; OpenVINO's default precision; 8-bit and 4-bit weight-only)
beside that environment's own eager model, and prints one JSON line: the approaches loaded,
their load times, the KV cache precision each compiled model reports, and why any failed.
Then it serves: each line on stdin names an approach and a prompt, and it runs that
``generate`` once and answers one JSON line with the seconds it took (measured here, so the
pipe costs nothing) and the tokens. The benchmark interleaves these
calls with its own approaches' in one cycled order, so both processes are timed under the same
machine state. An empty line ends it. It imports nothing of tunetree.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("request", help="the JSON request file benchmarks.generate_cpu writes")
    request_path = parser.parse_args().request
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
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(**inputs, **gen)
        seconds = time.perf_counter() - start
        print(json.dumps({"s": seconds, "tokens": out.tolist()}), flush=True)


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
