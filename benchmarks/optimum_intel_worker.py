"""optimum-intel's side of ``benchmarks.generate_cpu``, run in optimum-intel's own environment.

optimum-intel pins an older transformers, so it cannot share tunetree's environment: the
benchmark runs this file with that environment's Python. It reads a JSON request (the saved
model's directory, the prompts as token ids and masks, generate's keywords, the rounds),
loads the model with ``OVModelForCausalLM.from_pretrained(dir, export=True)`` four ways (f32
hint, OpenVINO's default precision, 8-bit and 4-bit weight-only) beside that environment's own eager
model, times them with :mod:`_cycled` (the same method as the benchmark) and prints one JSON
object on stdout: per approach and prompt, the median seconds of one ``generate`` and its
tokens. It imports nothing of tunetree.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cycled import cycled_medians


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
    rounds = int(request["rounds"])
    only = set(request.get("approaches") or ())
    loads = {
        "eager (optimum env)": lambda: AutoModelForCausalLM.from_pretrained(directory).eval(),
        "optimum-intel f32": lambda: OVModelForCausalLM.from_pretrained(
            directory, export=True, ov_config={"INFERENCE_PRECISION_HINT": "f32"}
        ),
        "optimum-intel default": lambda: OVModelForCausalLM.from_pretrained(directory, export=True),
        "optimum-intel int8 weights": lambda: OVModelForCausalLM.from_pretrained(
            directory, export=True, quantization_config=OVWeightQuantizationConfig(bits=8)
        ),
        "optimum-intel int4 weights": lambda: OVModelForCausalLM.from_pretrained(
            directory, export=True, quantization_config=OVWeightQuantizationConfig(bits=4)
        ),
    }
    models, load_s, failed = {}, {}, {}
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
    result: dict = {"load_s": load_s, "failed": failed, "prompts": {}}
    for prompt_name, prompt in request["prompts"].items():
        inputs = {k: torch.tensor(v) for k, v in prompt.items()}
        tokens = {}

        def run(model, inputs=inputs, name=None, tokens=tokens):
            with torch.no_grad():
                out = model.generate(**inputs, **gen)
            if name is not None:
                tokens[name] = out.tolist()
            return out

        for name, model in models.items():
            run(model, name=name)
        seconds = cycled_medians({n: (lambda m=m: run(m)) for n, m in models.items()}, rounds)
        result["prompts"][prompt_name] = {
            name: {"s": seconds[name], "tokens": tokens[name]} for name in models
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
