"""Rank-0-only work under a short collective timeout, objects gathered between ranks, TP's bytes.

1. The patient group. train.py's collectives time out after PARALLEL_TIMEOUT_S
   (launcher.init_distributed), so that a dead rank ends the run with one line instead of a hang.
   Some work only rank 0 does (writing a checkpoint, sampling, preparing the data) can take
   longer: a 13 GB checkpoint at 1 GB/s is 13 s. The other ranks must not wait for it inside the
   next step's all-reduce, whose timeout would fire, but in `Mesh.wait_for_rank0`, a barrier on a
   separate gloo group with a timeout of a day. Here train.py runs on 2 gloo ranks with
   PARALLEL_TIMEOUT_S=3 and a checkpoint write that takes 5 s on rank 0, at every step: the run
   must finish, every step logged. (Had rank 1 waited in the all-reduce, gloo would stop it.)
2. all_gather_object pickles its object; a CUDA tensor unpickles onto the GPU it came from, so
   every tensor must be copied to the CPU first (wiring._to_cpu). There is no GPU here:
   FakeCuda, a tensor that says it lives on "cuda" and gives its data back on .cpu(), stands in
   for one, and a spy on all_gather_object records the device of every tensor handed to it.
   train_run.gather_objects copies nothing: what it gathers (rng_state, the loader's state) is made
   on the CPU; it must return each rank's object, in rank order, equal to what that rank sent.

3. Tensor parallel's bytes are counted by the callers of f and g, outside autograd (a compiled
   backward may not update a Python dict): one step's count must equal the theory.

All three run in one launch of 2 forked ranks (a launch costs seconds).
"""

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
from torch.utils._pytree import tree_flatten, tree_map

import parallel as P
from machinery import checkpoints
from machinery import launch as launcher
from machinery import parallelize as wiring
from model import GPT, GPTConfig
from test_parallel import TRAIN_ARGS, tiny_dataset  # noqa: F401  (the fixture)

COLLECTIVE_TIMEOUT_S, SLOW_SAVE_S = 3, 5  # rank 0's save outlasts every collective's timeout
TP_CFG = GPTConfig(
    vocab_size=62, block_size=8, n_layer=2, n_head=2, n_kv_head=2, n_embd=16, ffn_hidden=32
)
TP_B, TP_T = 2, 8


class FakeCuda(torch.Tensor):
    """CPU data behind a tensor whose device is "cuda"; .cpu() (aten._to_copy) gives the data.
    >>> FakeCuda(torch.ones(2)).device.type, FakeCuda(torch.ones(2)).cpu().device.type
    ('cuda', 'cpu')
    """

    @staticmethod
    def __new__(cls, data):
        t = torch.Tensor._make_wrapper_subclass(cls, data.shape, dtype=data.dtype, device="cuda")
        t.data_ = data
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and kwargs.get("device") == torch.device("cpu"):
            return args[0].data_.clone()

        def unwrap(x):
            return x.data_ if isinstance(x, FakeCuda) else x

        out = func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs))
        return tree_map(lambda x: FakeCuda(x) if isinstance(x, torch.Tensor) else x, out)


def _devices_spy(record: list, real):
    """all_gather_object (`real`) that first records the device of every tensor in the object."""

    def spy(out, obj, group=None):
        record.extend(t.device.type for t in tree_flatten(obj)[0] if torch.is_tensor(t))
        return real(out, obj, group=group)

    return spy


def _rank0_work_and_gathers(rank, world, port, argv):
    import model_parallel as MP
    import train
    from machinery import run as train_run
    from machinery.commands import train as train_command

    # train.py starts its own group from torchrun's variables, with the short timeout.
    dist.destroy_process_group()
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        PARALLEL_TIMEOUT_S=str(COLLECTIVE_TIMEOUT_S),
    )
    save = train.atomic_save

    def slow_save(obj, path, **kwargs):
        time.sleep(SLOW_SAVE_S)
        save(obj, path, **kwargs)

    train.atomic_save = slow_save  # only rank 0 writes
    lines = []
    start = time.monotonic()
    train_run.train(train_command.parse_config(argv), log=lines.append)
    result = {"train_s": time.monotonic() - start, "log": "\n".join(map(str, lines))}

    # train_run.gather_objects over the data-parallel ranks: what each rank sent, in rank order.
    sent = {
        "rank": rank,
        "t": torch.arange(3.0) + 10 * rank,
        "rng": checkpoints.rng_state()["torch"],
    }
    mesh = P.Mesh.build(dp=world)
    result["sent"], result["got"] = (
        sent,
        train_run.gather_objects(sent, train_run.Dist(rank, world, mesh)),
    )

    # model_parallel's gathers over the pipeline ranks: a "GPU" buffer arrives as a CPU tensor.
    record: list = []
    real_gather = dist.all_gather_object
    dist.all_gather_object = _devices_spy(record, real_gather)
    stage = torch.nn.Module()
    stage.register_buffer(f"stage{rank}", FakeCuda(torch.full((2,), rank + 1.0)))
    result["merged"] = wiring.full_model_state_dict(stage, P.Mesh.build(dp=1, pp=world))
    result["devices"] = record
    dist.all_gather_object = real_gather

    # 3. tensor parallel's bytes, counted by the callers of f and g (outside autograd): one step.
    tp = P.Mesh.build(dp=1, tp=world).tp
    torch.manual_seed(0)
    split = MP.TensorParallel(GPT(TP_CFG), tp)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, TP_CFG.vocab_size, (TP_B, TP_T), generator=gen)
    tp.reset_counters()
    split(idx, idx)[1].backward()
    result["tp_bytes"] = tp.bytes_sent
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_rank0_work_outlasts_the_collective_timeout_and_gathers_arrive_on_the_cpu(
    tiny_dataset, tmp_path
):
    steps = 2  # the first save is followed by a step, the last by the end
    argv = [
        "--data",
        str(tiny_dataset),
        *TRAIN_ARGS,
        "--max-steps",
        str(steps),
        "--ckpt-interval",
        "1",
        "--num-samples",
        "0",
        "--log-interval",
        "1",
        "--no-plot",
        "--out-dir",
        str(tmp_path / "run"),
    ]
    results = launcher.launch(_rank0_work_and_gathers, 2, _free_port(), argv, timeout_s=180)
    # 1. every step's checkpoint took SLOW_SAVE_S on rank 0 while rank 1 waited; the run finished
    assert results[0]["train_s"] > steps * SLOW_SAVE_S > COLLECTIVE_TIMEOUT_S
    log = results[0]["log"]
    assert log.count(f"/{steps} | loss") == steps and "done in" in log, log[-800:]
    # 2. gather_objects: rank r's object, equal to what it sent, CPU tensors, on every rank
    for r in results:
        assert [g["rank"] for g in r["got"]] == [0, 1]
        for g, s in zip(r["got"], [results[0]["sent"], results[1]["sent"]]):
            assert g["t"].device.type == "cpu" and torch.equal(g["t"], s["t"])
            assert torch.equal(g["rng"], s["rng"])
    #    full_model_state_dict: both stages' buffers, handed to all_gather_object on the CPU
    for r in results:
        assert r["devices"] == ["cpu"], r["devices"]
        assert {k: v.tolist() for k, v in r["merged"].items()} == {
            "stage0": [1.0, 1.0],
            "stage1": [2.0, 2.0],
        }
        assert {v.device.type for v in r["merged"].values()} == {"cpu"}
    # 3. TP bytes of one forward and backward on 2 ranks: an all-reduce of k fp32 values sends
    #    2 (n-1)/n k 4 bytes = 4k. (B T C) values each: the embedding (g), per block f and g around
    #    attention and around the MLP (f's all-reduce runs in backward), the head's f; 3 (B T) for
    #    the vocabulary-parallel cross-entropy. f counted twice (also in backward) or not at all:
    #    the sum differs.
    tokens = TP_B * TP_T
    values = tokens * TP_CFG.n_embd * (1 + 4 * TP_CFG.n_layer + 1) + 3 * tokens
    assert [r["tp_bytes"] for r in results] == [4 * values] * 2
