"""The Qwen3 GSM8K recipe on a laptop CPU: ``configs/qwen3_gsm8k.py:runlocal,checkpoint=DIR,
data=PATH`` runs the whole loop from a Qwen3-format checkpoint folder (here a tiny random one
written by save_hf_checkpoint, with the test tokenizer and Qwen3's chat template of
test_hf_tokenizer.py) and GSM8K's released JSONL files: the checkpoint's shapes, its tokenizer
and template, a few RL steps, an evaluation on the test split, summary.json."""

import json
import os
from pathlib import Path

from hf_fixtures import random_model
from test_hf_tokenizer import QWEN_CONFIG, write_folder

from gspo_jax import config as config_lib
from gspo_jax import data, models, tasks
from gspo_jax.rl import build, trainer

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "tests" / "data" / "gsm8k_sample.jsonl"


def tiny_checkpoint_and_gsm8k(root: Path, config_json: dict, max_seq_len: int = 512):
    """A tiny random Qwen3-format checkpoint (the test tokenizer, ``config_json``'s template)
    and GSM8K files from the fixture (14 train, the rest test): (checkpoint, data folder)."""
    ckpt = write_folder(root / "Qwen3-tiny", config_json, dict(eos_token_id=[2, 0]))
    vocab = tasks.HFTokenizer(ckpt).vocab_size
    cfg = models.get_model_config("tiny", vocab_size=vocab, max_seq_len=max_seq_len, num_layers=1)
    models.save_hf_checkpoint(random_model(cfg), ckpt)
    lines = FIXTURE.read_text().splitlines()
    gsm = root / "gsm8k"
    gsm.mkdir()
    (gsm / "train.jsonl").write_text("\n".join(lines[:14]) + "\n")
    (gsm / "test.jsonl").write_text("\n".join(lines[14:]) + "\n")
    return ckpt, gsm


def test_runlocal_recipe_from_a_checkpoint_and_gsm8k_files(shared, tmp_path):
    ckpt, gsm = tiny_checkpoint_and_gsm8k(tmp_path, QWEN_CONFIG)

    config = config_lib.load_config_file(
        f"{REPO}/configs/qwen3_gsm8k.py:runlocal,checkpoint={ckpt},data={gsm}"
    )
    config.unlock()
    config.data.data_dir, config.init.cache_dir = shared["data"], shared["cache"]
    config.log.progress = False
    # Smaller than the recipe's laptop sizes only to keep CI cheap; the loop is the same.
    config.task.kwargs.max_prompt_len, config.rl.max_new_tokens = 128, 8
    config.eval.num_problems, config.eval.batch_size = 4, 8
    config.rl.prompts_per_step, config.rl.group_size, config.rl.num_minibatches = 4, 2, 2
    run = build.build_run(config)
    assert run.model_cfg == models.config_from_hf(
        json.loads((ckpt / "config.json").read_text()), dtype="float32"
    )  # the checkpoint's own shapes, not a preset's
    batch, _ = data.make_eval_batches(run.task, "test", batch_size=1, data_dir=shared["data"])[0]
    text = run.task.prompt_text(data.load_source(run.task, "test", shared["data"])[0])
    assert text.startswith("<|im_start|>user\n") and text.endswith(
        "\\boxed{}.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )  # the checkpoint's chat template, the boxed-answer instruction, thinking off
    ids = run.task.tokenizer.encode(text)[-128:]
    assert batch["prompt"][0, : batch["prompt_length"][0]].tolist() == ids

    workdir = str(tmp_path / "run")
    summary = trainer.train(config, workdir)
    assert summary["steps"] == config.rl.num_steps == 2
    assert summary["base"]["num_problems"] == summary["final"]["num_problems"] == 4
    with open(os.path.join(workdir, "summary.json")) as f:
        assert json.load(f)["final"] == summary["final"]
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        steps = {json.loads(line).get("step") for line in f}
    assert {1, 2} <= steps
