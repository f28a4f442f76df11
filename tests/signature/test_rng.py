"""Torch's global generator: left alone by a background tune, draws found before they happen."""

from __future__ import annotations

import threading

import torch

from tunetree.signature.rng import global_draw, rng_left_alone
from tunetree.signature.state import preserved_state


def test_a_global_draw_is_found_before_it_draws() -> None:
    torch.manual_seed(3)
    before = torch.get_rng_state()
    assert global_draw(lambda: torch.tanh(torch.ones(2)) + torch.rand(2)).startswith("aten.rand")
    assert torch.equal(before, torch.get_rng_state())
    assert global_draw(lambda: torch.multinomial(torch.ones(4), 2)).startswith("aten.multinomial")


def test_draws_from_a_generator_of_its_own_and_eval_dropout_are_not_global() -> None:
    g = torch.Generator().manual_seed(0)
    drop = torch.nn.Dropout(0.5).eval()
    assert global_draw(lambda: drop(torch.randn(3, generator=g))) == ""
    assert global_draw(lambda: torch.ones(3).bernoulli_(0.5, generator=g)) == ""


def test_preserved_state_restores_the_rng_unless_it_is_left_alone() -> None:
    model = torch.nn.Linear(2, 2)
    torch.manual_seed(0)
    with preserved_state(model):
        torch.randn(5)
    assert torch.equal(torch.randn(5), (torch.manual_seed(0), torch.randn(5))[1])
    torch.manual_seed(0)
    with rng_left_alone(), preserved_state(model):
        torch.randn(5)
    assert not torch.equal(torch.randn(5), (torch.manual_seed(0), torch.randn(5))[1])


def test_leaving_the_rng_alone_holds_in_its_own_thread_only() -> None:
    seen: list[bool] = []
    model = torch.nn.Linear(2, 2)

    def other() -> None:
        torch.manual_seed(1)
        with preserved_state(model):
            torch.randn(3)
        seen.append(torch.equal(torch.randn(3), (torch.manual_seed(1), torch.randn(3))[1]))

    with rng_left_alone():
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
    assert seen == [True]  # restored there: another thread is not under rng_left_alone


def test_attention_without_dropout_and_a_zero_probability_draw_nothing() -> None:
    q = torch.randn(1, 2, 4, 8)
    attention = torch.nn.functional.scaled_dot_product_attention
    assert global_draw(lambda: attention(q, q, q)) == ""
    assert global_draw(lambda: attention(q, q, q, dropout_p=0.5)) != ""
    assert global_draw(lambda: torch.nn.functional.dropout(q, 0.1, training=True)) != ""


def test_what_still_draws_at_probability_zero_is_found() -> None:
    x = torch.ones(3)
    assert global_draw(lambda: x.clone().bernoulli_(0.0)) != ""  # draws anyway
    assert global_draw(lambda: torch.ops.aten.native_dropout(x, 0.0, True)) != ""
    assert global_draw(lambda: torch.ops.aten.native_dropout(x, 0.5, False)) == ""


def test_a_hugging_face_encoder_in_eval_mode_draws_nothing() -> None:
    transformers = __import__("pytest").importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    )
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 64, (2, 7))
    assert global_draw(lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids))) == ""
    model.train()  # its dropouts draw
    assert global_draw(lambda: model(input_ids=ids)) != ""
