"""``tunetree tune DIR``: a saved Hugging Face encoder and causal LM tuned from their
directories, read back by ``tunetree info`` and loaded onto ``from_pretrained`` models; every
bad argument is one line on stderr and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import tunetree as tt
from tunetree.cli import main

transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

VOCAB = 100


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    directory = tmp_path_factory.mktemp("bert")
    transformers.BertModel(config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    directory = tmp_path_factory.mktemp("llama")
    transformers.LlamaForCausalLM(config).save_pretrained(directory)
    return directory


def _ids(batch: int, length: int, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=g)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _status(argv: list[str]) -> int:
    """The exit status of ``tunetree ARGV``, whether it returns it or argparse exits."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _tune(directory: Path, tmp_path: Path, *extra: str) -> tuple[int, Path]:
    out = tmp_path / "model.tt"
    code = main(
        [
            "tune",
            str(directory),
            *extra,
            "--quick",
            "--budget",
            "20",
            "--cache",
            str(tmp_path / "cache"),
            "--out",
            str(out),
        ]
    )
    return code, out


def test_tune_a_saved_encoder_then_info_and_load(
    bert_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _tune(bert_dir, tmp_path, "--task", "feature-extraction", "--shapes", "1x8,2x16")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "depth" in captured.out and "saved" in captured.out and out.is_file()
    assert main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["compatible"] is True and info["model_type"].endswith("BertModel")
    eager = transformers.AutoModel.from_pretrained(bert_dir).eval()
    tuned = tt.load_pretrained(bert_dir, out, task="feature-extraction")
    with torch.no_grad():
        for batch, length in ((1, 8), (2, 11), (3, 5)):  # the tuned shapes and unseen ones
            x = _ids(batch, length)
            expected = eager(**x).last_hidden_state
            got = tuned(**x).last_hidden_state
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


def test_tune_a_saved_causal_lm_through_generate_then_info_and_load(
    llama_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _tune(
        llama_dir,
        tmp_path,
        "--task",
        "text-generation",
        "--shapes",
        "1x8,2x12",
        "--new-tokens",
        "4",
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert main(["info", str(out)]) == 0
    assert "plan (" in capsys.readouterr().out
    eager = transformers.AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    tuned = tt.load(transformers.AutoModelForCausalLM.from_pretrained(llama_dir), out)
    settings: dict[str, Any] = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
    for batch, length in ((1, 8), (1, 10), (2, 9)):
        x = _ids(batch, length, seed=batch + length)
        assert torch.equal(tuned.generate(**x, **settings), eager.generate(**x, **settings))


def _tuned_with_onnxruntime(model: Any, samples: list[Any], **kwargs: Any) -> Any:
    return tt.tune(
        model,
        samples,
        depth=0,
        strategy=tt.OneBackendStrategy(tt.backends.OnnxRuntime()),
        measure_config=tt.MeasureConfig.quick(),
        verbose=False,
        cache=False,
        **kwargs,
    )


def test_load_pretrained_serves_runners_with_eagers_outputs_on_unseen_shapes(
    bert_dir: Path, tmp_path: Path
) -> None:
    """Whatever the busy machine measured above, here a plan that holds a runner for sure:
    ``load_pretrained`` rebuilds it on a ``from_pretrained`` model, and unseen shapes inside
    and outside the tuned range give eager's outputs."""
    from tunetree.commands.tune_inputs import synthetic_samples
    from tunetree.pretrained import TASKS

    model = tt.pretrained.build_pretrained(bert_dir, "feature-extraction")
    samples = synthetic_samples(model, TASKS["feature-extraction"], [(2, 8), (3, 16)], "cpu")
    result = _tuned_with_onnxruntime(model, samples)
    assert result.graphs and result.graphs[0].winner.backend.name == "onnxruntime"
    path = tt.save(result, tmp_path / "bert.tt")
    tuned = tt.load_pretrained(bert_dir, path, task="feature-extraction")
    eager = transformers.AutoModel.from_pretrained(bert_dir).eval()
    with torch.no_grad():
        for batch, length in ((2, 12), (3, 9), (1, 20)):
            x = _ids(batch, length)
            torch.testing.assert_close(
                tuned(**x).last_hidden_state, eager(**x).last_hidden_state, rtol=1e-4, atol=1e-5
            )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--task", "juggling", "--shapes", "1x8"], "unknown task 'juggling'; one of:"),
        (["--task", "feature-extraction", "--shapes", "1by8"], "'1by8' is not BATCHxLENGTH"),
        (["--task", "feature-extraction", "--shapes", "0x8"], "batch and length are 1 to"),
        (["--task", "image-classification", "--shapes", "1x8"], "cannot do image-classification"),
        (["--task", "feature-extraction"], "one of the arguments --shapes --inputs is required"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    bert_dir: Path,
    tmp_path: Path,
    arguments: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = _status(["tune", str(bert_dir), *arguments, "--out", str(tmp_path / "m.tt")])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err and not (tmp_path / "m.tt").exists()


def test_a_directory_without_a_config_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for directory in (tmp_path, tmp_path / "missing"):
        task = ["--task", "feature-extraction", "--shapes", "1x8"]
        code = _status(["tune", str(directory), *task, "--out", str(tmp_path / "m.tt")])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert "no config.json" in err or "is not a directory" in err


WORDS = ["the", "cat", "sat", "on", "a", "mat", "dog", "ran", "far", "away"]


@pytest.fixture(scope="module")
def bert_with_tokenizer(bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    directory = tmp_path_factory.mktemp("bert-tok")
    for item in bert_dir.iterdir():
        shutil.copy(item, directory / item.name)
    vocab = directory / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    transformers.BertTokenizer(vocab_file=str(vocab)).save_pretrained(directory)
    return directory


def test_texts_go_through_the_directorys_tokenizer(
    bert_with_tokenizer: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on a mat\nthe dog ran far away from the cat\na dog\n")
    code, out = _tune(
        bert_with_tokenizer, tmp_path, "--task", "feature-extraction", "--inputs", str(texts)
    )
    assert code == 0, capsys.readouterr().err
    tuned = tt.load_pretrained(bert_with_tokenizer, out, task="feature-extraction")
    eager = transformers.AutoModel.from_pretrained(bert_with_tokenizer).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert_with_tokenizer)
    batch = tokenizer(["a cat ran", "the mat sat far away"], return_tensors="pt", padding=True)
    with torch.no_grad():
        torch.testing.assert_close(
            tuned(**batch).last_hidden_state,
            eager(**batch).last_hidden_state,
            rtol=1e-4,
            atol=1e-5,
        )


def test_input_files_hold_the_models_keyword_arguments(
    bert_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from safetensors.torch import save_file

    from tunetree.commands.tune_inputs import samples_from_file
    from tunetree.pretrained import TASKS

    task, cpu = TASKS["feature-extraction"], torch.device("cpu")
    calls = [_ids(1, 8), _ids(2, 12)]
    torch.save(calls, tmp_path / "calls.pt")
    save_file(calls[0], str(tmp_path / "call.safetensors"))
    got = samples_from_file(tmp_path / "calls.pt", bert_dir, task, cpu)
    assert [c["input_ids"].shape for c in got] == [(1, 8), (2, 12)]
    got = samples_from_file(tmp_path / "call.safetensors", bert_dir, task, cpu)
    assert torch.equal(got[0]["input_ids"], calls[0]["input_ids"])
    torch.save({"input_ids": [1, 2]}, tmp_path / "bad.pt")
    (tmp_path / "texts.txt").write_text("the cat\n")
    for bad, message in (
        ("bad.pt", "must hold a dict of named tensors"),
        ("texts.txt", "texts need a tokenizer"),  # bert_dir has no tokenizer files
        ("missing.pt", "is not a file"),
    ):
        task_args = ["--task", "feature-extraction", "--inputs", str(tmp_path / bad)]
        code = _status(["tune", str(bert_dir), *task_args, "--out", str(tmp_path / "m.tt")])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def _tiny_vit_config() -> Any:
    """A 1-layer ViT of 32x32 images in 8x8 patches, 3 labels."""
    return transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
    )


def test_image_shapes_must_fit_the_models_image_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _tiny_vit_config()
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path / "vit")
    capsys.readouterr()  # save_pretrained's own progress bar
    argv = ["tune", str(tmp_path / "vit"), "--task", "image-classification", "--shapes", "1x224"]
    code = _status([*argv, "--out", str(tmp_path / "m.tt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("tunetree tune: error: --shapes: this model takes")
    assert "side 32" in err[0] and "not 224" in err[0]


@pytest.fixture(scope="module")
def vit_with_processor(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    config = _tiny_vit_config()
    directory = tmp_path_factory.mktemp("vit")
    transformers.ViTForImageClassification(config).save_pretrained(directory)
    transformers.ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(directory)
    return directory


def _pictures(folder: Path) -> Path:
    from PIL import Image

    folder.mkdir()
    g = torch.Generator().manual_seed(3)
    for name, (w, h) in (("a.png", (40, 30)), ("b.jpg", (64, 64)), ("c.png", (17, 50))):
        pixels = torch.randint(0, 256, (h, w, 3), generator=g, dtype=torch.uint8).numpy()
        Image.fromarray(pixels).save(folder / name)
    (folder / "notes.txt").write_text("not an image\n")
    return folder


def test_image_files_go_through_the_directorys_image_processor(
    vit_with_processor: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from PIL import Image

    from tunetree.commands.tune_inputs import samples_from_file
    from tunetree.pretrained import TASKS

    task, cpu = TASKS["image-classification"], torch.device("cpu")
    folder = _pictures(tmp_path / "pictures")
    processor = transformers.AutoImageProcessor.from_pretrained(vit_with_processor)
    images = [Image.open(folder / n).convert("RGB") for n in ("a.png", "b.jpg", "c.png")]
    calls = samples_from_file(folder, vit_with_processor, task, cpu)
    assert [tuple(c["pixel_values"].shape) for c in calls] == [(1, 3, 32, 32)] * 3 + [
        (3, 3, 32, 32)
    ]
    expected = processor(images=images, return_tensors="pt")["pixel_values"]
    assert torch.equal(calls[-1]["pixel_values"], expected)
    one = samples_from_file(folder / "b.jpg", vit_with_processor, task, cpu)
    assert len(one) == 1 and torch.equal(one[0]["pixel_values"], expected[1:2])

    code, out = _tune(
        vit_with_processor, tmp_path, "--task", "image-classification", "--inputs", str(folder)
    )
    assert code == 0, capsys.readouterr().err
    tuned = tt.load_pretrained(vit_with_processor, out, task="image-classification")
    eager = transformers.AutoModelForImageClassification.from_pretrained(vit_with_processor)
    with torch.no_grad():
        x = expected[:2]  # a batch size the tune never saw
        torch.testing.assert_close(
            tuned(pixel_values=x).logits, eager.eval()(pixel_values=x).logits, rtol=1e-4, atol=1e-5
        )


def test_bad_image_inputs_are_one_line_and_exit_2(
    vit_with_processor: Path,
    bert_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from tunetree.commands import tune_inputs

    folder = _pictures(tmp_path / "pictures")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    vit = ["--task", "image-classification", "--inputs"]
    cases = [
        (
            bert_dir,
            ["--task", "feature-extraction", "--inputs", str(folder / "a.png")],
            "images cannot feed a text task",
        ),
        (bert_dir.parent, [*vit, str(folder)], "no config.json"),
        (vit_with_processor, [*vit, str(tmp_path / "empty")], "holds no .png"),
        (vit_with_processor, [*vit, str(tmp_path / "broken.png")], "cannot be read as an image"),
        (vit_with_processor, [*vit, str(tmp_path / "gone.png")], "is not a file"),
    ]
    bare = tmp_path / "vit-no-processor"
    bare.mkdir()
    for item in vit_with_processor.iterdir():
        if item.name != "preprocessor_config.json":
            (bare / item.name).write_bytes(item.read_bytes())
    cases.append((bare, [*vit, str(folder)], "images need an image processor"))
    for directory, arguments, message in cases:
        code = _status(["tune", str(directory), *arguments, "--out", str(tmp_path / "m.tt")])
        err = capsys.readouterr().err
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (message, err)
    monkeypatch.setattr(tune_inputs, "MAX_IMAGE_PIXELS", 32 * 32)
    code = _status(
        ["tune", str(vit_with_processor), *vit, str(folder), "--out", str(tmp_path / "m.tt")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "states 40x30 pixels, over 1024" in err, err
    assert not (tmp_path / "m.tt").exists()
