"""A tuned Hugging Face encoder behind a real HTTP server (FastAPI on uvicorn).

Start-up builds the model from its directory and loads the tuned checkpoint onto it
(``tt.load_pretrained``: every runner is checked against eager before it serves); requests
then run on uvicorn's worker threads, several at once. ``--eager`` serves the untuned model,
for comparison.

Run: python examples/serving/server.py --model-dir DIR --checkpoint model.tt --port 8000
     curl -X POST localhost:8000/embed -H 'content-type: application/json' \\
          -d '{"input_ids": [[5, 6, 7]], "attention_mask": [[1, 1, 1]]}'
Needs ``pip install "tunetree[serve,hf]"``.
"""

from __future__ import annotations

import argparse
import time
from contextlib import asynccontextmanager
from typing import Any

import torch
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

import tunetree as tt

STARTED = time.perf_counter()
"""When this process started importing (start-up time is counted from here)."""

MAX_TOKENS = 4096
"""The most token ids one request may send (batch x length)."""


class EmbedRequest(BaseModel):
    """A batch of token ids and its attention mask, as a tokenizer returns them."""

    input_ids: list[list[int]]
    attention_mask: list[list[int]]


def create_app(model_dir: str, checkpoint: str | None, task: str = "feature-extraction") -> Any:
    """The FastAPI app; the model is loaded once, at start-up (``checkpoint`` None: eager,
    built for feature extraction)."""
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> Any:
        if checkpoint is None:
            import transformers

            state["model"] = transformers.AutoModel.from_pretrained(model_dir).eval()
        else:
            state["model"] = tt.load_pretrained(model_dir, checkpoint, task=task)
        state["startup_s"] = time.perf_counter() - STARTED
        yield
        state.clear()

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"ready": "model" in state, "tuned": checkpoint is not None, **_startup(state)}

    @app.post("/embed")
    def embed(request: EmbedRequest) -> dict[str, Any]:
        # A plain `def`: FastAPI runs it on its thread pool, so requests reach the model from
        # several threads at once (see docs/serving.md for what each backend does then).
        ids = torch.tensor(request.input_ids, dtype=torch.long)
        mask = torch.tensor(request.attention_mask, dtype=torch.long)
        if ids.dim() != 2 or ids.shape != mask.shape or ids.numel() > MAX_TOKENS:
            raise HTTPException(422, "input_ids and attention_mask: the same 2-D shape")
        with torch.inference_mode():
            out = state["model"](input_ids=ids, attention_mask=mask).last_hidden_state
        return {"last_hidden_state": out.tolist()}

    return app


def _startup(state: dict[str, Any]) -> dict[str, Any]:
    return {"startup_s": state["startup_s"]} if "startup_s" in state else {}


def main() -> None:
    """Parse the arguments and serve until interrupted."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", required=True, help="the save_pretrained directory")
    parser.add_argument("--checkpoint", help="the tuned .tt file (tunetree tune ... --out)")
    parser.add_argument("--eager", action="store_true", help="serve the untuned model")
    parser.add_argument("--task", default="feature-extraction")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    if not args.eager and args.checkpoint is None:
        parser.error("--checkpoint is required unless --eager")
    checkpoint = None if args.eager else args.checkpoint
    app = create_app(args.model_dir, checkpoint, args.task)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
