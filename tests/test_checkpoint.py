"""Orbax checkpoints: full state round trip, data-iterator state, resharding on restore."""

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from gspo_jax.runtime import checkpoint


def _iterator():
    ds = grain.MapDataset.range(100).shuffle(seed=0).repeat().batch(4).to_iter_dataset()
    return iter(ds)


def _state(mesh):
    sh = NamedSharding(mesh, PartitionSpec("data"))
    params = {"w": jax.device_put(jnp.arange(16.0), sh), "b": jnp.ones(3)}
    tx = optax.adamw(1e-2)
    opt = tx.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt = tx.update(grads, opt, params)  # non-trivial moments
    rng = jax.random.key_data(jax.random.key(7))
    return {"params": params, "opt": opt, "step": jnp.int32(5), "rng": rng}


def _abstract(tree, mesh=None):
    def one(x):
        sh = x.sharding
        if mesh is not None:
            sh = NamedSharding(mesh, PartitionSpec(*([None] * x.ndim)))
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh)

    return jax.tree.map(one, tree)


def test_round_trip_state_and_iterator(tmp_path):
    mesh = jax.make_mesh((8,), ("data",))
    state = _state(mesh)
    it = _iterator()
    next(it), next(it)
    ck = checkpoint.Checkpointer(str(tmp_path / "ck"), save_every=5)
    assert ck.latest_step() is None
    assert not ck.save(3, state, it)  # not due
    assert ck.save(5, state, it, {"wall_s": 1.5})
    ck.wait()
    expected_next = next(it)

    ck2 = checkpoint.Checkpointer(str(tmp_path / "ck"), save_every=5)
    assert ck2.latest_step() == 5
    it2 = _iterator()
    restored, meta = ck2.restore(5, _abstract(state), it2)
    np.testing.assert_array_equal(next(it2), expected_next)
    assert meta["wall_s"] == 1.5 and meta["step"] == 5
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert restored["params"]["w"].sharding == state["params"]["w"].sharding
    assert type(restored["opt"][0]).__name__ == "ScaleByAdamState"
    # one JSON file per process for the data iterator
    files = list((tmp_path / "ck" / "5" / "data_iter").glob("process_*.json"))
    assert [f.name for f in files] == ["process_0-of-1.json"]
    ck.close()
    ck2.close()


def test_restore_onto_another_mesh(tmp_path):
    state = _state(jax.make_mesh((8,), ("data",)))
    it = _iterator()
    ck = checkpoint.Checkpointer(str(tmp_path), save_every=1, async_save=False)
    ck.save(1, state, it)
    one = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    restored, _ = ck.restore(1, _abstract(state, one), _iterator())
    assert restored["params"]["w"].sharding.mesh.size == 1
    np.testing.assert_array_equal(restored["params"]["w"], np.arange(16.0))
    ck.close()


class _BytesIterator:
    """An iterator whose state is bytes (like grain's DataLoaderIterator)."""

    def __init__(self):
        self.pos = 0

    def get_state(self):
        return f'{{"pos": {self.pos}}}'.encode()

    def set_state(self, s):
        import json

        self.pos = json.loads(s.decode())["pos"]


def test_bytes_iterator_state_and_forced_save(tmp_path):
    it = _BytesIterator()
    it.pos = 11
    ck = checkpoint.Checkpointer(str(tmp_path), save_every=100)
    assert ck.save(3, {"x": jnp.zeros(2)}, it, force=True)
    assert not ck.save(3, {"x": jnp.zeros(2)}, it, force=True)  # already there
    ck.wait()
    it2 = _BytesIterator()
    ck.restore(3, {"x": jax.ShapeDtypeStruct((2,), jnp.float32)}, it2)
    assert it2.pos == 11
    ck.close()
    with pytest.raises(ValueError, match="save_every"):
        checkpoint.Checkpointer(str(tmp_path), save_every=0)


# ------------------------------------------------------------------ integrity and failing writers


def _two_checkpoints(directory):
    """Checkpoints at steps 1 and 2 of a small state; returns (state, iterator positions)."""
    ck = checkpoint.Checkpointer(str(directory), save_every=1, async_save=False)
    it = _BytesIterator()
    for step in (1, 2):
        it.pos = 10 * step
        ck.save(step, {"x": jnp.full(64, float(step))}, it)
    ck.close()


_ABS = {"x": jax.ShapeDtypeStruct((64,), jnp.float32)}


def _truncate_array_files(step_dir):
    """Cuts the array data files (orbax's OCDBT data under state/.../d/) to 10 bytes."""
    files = [
        p for p in step_dir.joinpath("state").rglob("*") if p.is_file() and p.parent.name == "d"
    ]
    assert files
    for f in files:
        f.write_bytes(f.read_bytes()[:10])


def _empty_step_folder(step_dir):
    import shutil

    shutil.rmtree(step_dir)
    step_dir.mkdir()


def _remove_iterator_file(step_dir):
    (step_dir / "data_iter" / "process_0-of-1.json").unlink()


@pytest.mark.parametrize(
    "corrupt, why",
    [
        (_truncate_array_files, ""),
        (_empty_step_folder, "the step folder is empty"),
        (_remove_iterator_file, "missing file"),
    ],
)
def test_unreadable_checkpoint_falls_back_to_the_previous_one(tmp_path, corrupt, why):
    _two_checkpoints(tmp_path)
    corrupt(tmp_path / "2")
    lines = []
    ck = checkpoint.Checkpointer(str(tmp_path), save_every=1)
    it = _BytesIterator()
    step, state, meta = ck.restore_latest(_ABS, it, report=lines.append)
    assert step == 1 and meta["step"] == 1 and it.pos == 10
    np.testing.assert_array_equal(state["x"], np.full(64, 1.0))
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("checkpoint step 2 is unreadable") and why in lines[0]
    assert "falling back to step 1" in lines[0]
    # moved aside (kept, not deleted), and out of the way of the step-2 save that comes next
    assert ck.all_steps() == [1]
    assert [p.name.split(".")[0] for p in tmp_path.glob("2.unreadable-*")] == ["2"]
    assert ck.save(2, {"x": jnp.zeros(64)}, it)
    ck.close()


def test_no_readable_checkpoint_is_one_error_naming_the_choices(tmp_path):
    _two_checkpoints(tmp_path)
    _empty_step_folder(tmp_path / "1")
    _empty_step_folder(tmp_path / "2")
    ck = checkpoint.Checkpointer(str(tmp_path), save_every=1)
    lines = []
    with pytest.raises(checkpoint.CheckpointError, match="could be restored") as e:
        ck.restore_latest(_ABS, _BytesIterator(), report=lines.append)
    msg = str(e.value)
    assert "--start_fresh" in msg and str(tmp_path) in msg and "\n" not in msg
    assert "step 2: " in msg and "step 1: " in msg and "the step folder is empty" in msg
    assert lines == [] and ck.all_steps() == [1, 2]  # nothing moved: nothing proves them corrupt
    ck.close()


def test_a_checkpoint_of_another_structure_is_not_moved_aside(tmp_path):
    """A target that does not match (a changed config) fails every step: that is no corruption,
    so every step stays where it is, and the error names the mismatch."""
    _two_checkpoints(tmp_path)
    ck = checkpoint.Checkpointer(str(tmp_path), save_every=1)
    other = {"x": jax.ShapeDtypeStruct((32,), jnp.float32)}
    with pytest.raises(checkpoint.CheckpointError, match="rerun with the config"):
        ck.restore_latest(other, _BytesIterator(), report=pytest.fail)
    assert ck.all_steps() == [1, 2]
    assert not list(tmp_path.glob("*.unreadable-*"))
    ck.close()


def test_a_file_in_place_of_the_checkpoint_folder_is_an_error(tmp_path):
    path = tmp_path / "checkpoints"
    path.write_text("not a folder")
    with pytest.raises(checkpoint.CheckpointError, match="is a file, not a checkpoint folder"):
        checkpoint.Checkpointer(str(path), save_every=1)
    assert path.read_text() == "not a folder"


def test_iterator_state_restores_on_another_process_count_when_shared(tmp_path):
    _two_checkpoints(tmp_path)
    src = tmp_path / "2" / "data_iter" / "process_0-of-1.json"
    src.rename(src.with_name("process_0-of-2.json"))  # as a 2-process run writes it
    ck = checkpoint.Checkpointer(str(tmp_path), save_every=1)
    with pytest.raises(ValueError, match="another process count"):
        ck.restore(2, _ABS, _BytesIterator())
    it = _BytesIterator()
    ck.restore(2, _ABS, it, any_process_count=True)
    assert it.pos == 20
    ck.close()


def _failing_writer(monkeypatch, delay=0.2):
    """Makes every array write fail in the background, as a full disk does."""
    import errno
    import time

    import orbax.checkpoint as ocp

    class _Failing:
        def result(self, timeout=None):
            time.sleep(delay)
            raise OSError(errno.ENOSPC, "No space left on device")

    real = ocp.type_handlers.ArrayHandler.serialize

    async def serialize(self, *args, **kwargs):
        return [*(await real(self, *args, **kwargs)), _Failing()]

    monkeypatch.setattr(ocp.type_handlers.ArrayHandler, "serialize", serialize)


def test_failed_background_save_surfaces_in_one_line_and_keeps_the_previous(
    tmp_path, monkeypatch, capfd
):
    import time

    ck = checkpoint.Checkpointer(str(tmp_path), save_every=1)
    it = _BytesIterator()
    ck.save(1, {"x": jnp.ones(64)}, it)
    ck.wait()
    _failing_writer(monkeypatch)
    assert ck.save(2, {"x": jnp.ones(64)}, it)  # started; fails in the background
    deadline = time.time() + 30
    with pytest.raises(checkpoint.CheckpointSaveError) as e:
        while time.time() < deadline:
            ck.check_background()  # what the trainer calls after every step
            time.sleep(0.05)
    msg = str(e.value)
    assert "\n" not in msg and "step 2" in msg and "No space left on device" in msg
    assert "the previous checkpoint, step 1, is kept" in msg
    assert ck.all_steps() == [1]
    assert capfd.readouterr().err.count("Traceback") == 0  # orbax's tracebacks are muted
    monkeypatch.undo()
    ck.close()
