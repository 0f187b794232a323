"""Tensor-parallel flags and start-up checks: what is refused, with which one-line error,
and how ranks and shards are laid out."""

from __future__ import annotations

import pytest
from tiny_model import make_tiny_llama

from sluice.runtime.cli import build_parser, main
from sluice.runtime.distributed.topology import node_ranks, parse_host_port
from sluice.runtime.model.config import ModelConfig
from sluice.runtime.model.registry import model_config
from sluice.runtime.model.sharding import LlamaShard, tensor_parallel_problem
from sluice.runtime.server_args import ServerArgs


def config(heads: int = 8, kv: int = 2, intermediate: int = 128, vocab: int = 512) -> ModelConfig:
    return model_config({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16 * heads,
        "num_hidden_layers": 2, "num_attention_heads": heads, "num_key_value_heads": kv,
        "intermediate_size": intermediate, "vocab_size": vocab,
    })  # fmt: skip


def args(*argv: str) -> ServerArgs:
    return ServerArgs.from_cli_args(build_parser().parse_args(["serve", *argv]))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--tensor-parallel-size", "0"], "--tensor-parallel-size must be >= 1"),
        (["--tensor-parallel-size", "3", "--nnodes", "2", "--dist-init-addr", "h:1"],
         "--tensor-parallel-size 3 is not a multiple of --nnodes 2"),
        (["--tensor-parallel-size", "2", "--nnodes", "2"], "--nnodes > 1 needs --dist-init-addr"),
        (["--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "2",
          "--dist-init-addr", "h:1"], "--node-rank must be in [0, 1]"),
        (["--dist-init-addr", "nohost"], "is not host:port"),
    ],
)  # fmt: skip
def test_bad_tensor_parallel_flags_exit_2_with_one_line(argv, message, capsys):
    assert main(["serve", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_flags_parse_for_a_multi_node_group():
    a = args("--tensor-parallel-size", "4", "--nnodes", "2", "--node-rank", "1",
             "--dist-init-addr", "10.0.0.1:29500")  # fmt: skip
    ranks = node_ranks(a.tensor_parallel_size, a.nnodes, a.node_rank, a.dist_init_addr)
    assert [(r.rank, r.local_rank, r.local_size) for r in ranks] == [(2, 0, 2), (3, 1, 2)]
    assert {r.init_method for r in ranks} == {"tcp://10.0.0.1:29500"}
    assert parse_host_port("[::1]:8000") == ("::1", 8000)


def test_one_node_meets_at_a_free_local_port():
    ranks = node_ranks(2, 1, 0, "")
    assert [r.rank for r in ranks] == [0, 1] and ranks[0].is_leader
    assert ranks[0].init_method.startswith("tcp://127.0.0.1:")
    assert ranks[1].process_name == "scheduler (tp rank 1)"


@pytest.mark.parametrize(
    "tp, model, device, gpus, message",
    [
        (3, config(), "cpu", 0, "--tensor-parallel-size 3 does not divide the model's 8 attention heads"),
        (2, config(heads=6, kv=3), "cpu", 0, "the model's 3 KV heads: one must divide the other"),
        (4, config(intermediate=130), "cpu", 0, "does not divide the model's MLP width 130"),
        (2, config(), "cuda", 1, "--tensor-parallel-size 2 needs 2 GPUs on this node but 1 is visible"),
        (2, config(), "cuda", 2, None),
        (4, config(kv=2), "cpu", 0, None),  # KV heads replicated
        (8, config(kv=1), "cpu", 0, None),
    ],
)  # fmt: skip
def test_start_up_refuses_a_split_the_model_or_machine_cannot_take(tp, model, device, gpus, message):
    problem = tensor_parallel_problem(tp, 1, model, device, gpus)
    assert problem == message if message is None else message in problem


def test_start_up_refusal_is_one_line_and_exit_2(tmp_path, capsys):
    folder = make_tiny_llama(tmp_path / "m")  # 4 heads
    code = main(["serve", "--model", str(folder), "--device", "cpu", "--tensor-parallel-size", "3"])
    assert code == 2
    last = capsys.readouterr().err.splitlines()[-1]  # (after any library's import warnings)
    assert last == "sluice serve: --tensor-parallel-size 3 does not divide the model's 4 attention heads"


def test_more_ranks_than_gpus_is_refused_before_anything_starts(tmp_path, capsys):
    folder = make_tiny_llama(tmp_path / "m")
    code = main(["serve", "--model", str(folder), "--device", "cuda", "--tensor-parallel-size", "4"])
    assert code == 2
    import torch

    visible = torch.cuda.device_count()
    if visible < 4:
        assert "needs 4 GPUs on this node but" in capsys.readouterr().err


@pytest.mark.parametrize("tp, kv, expected", [(2, 2, [0, 1]), (4, 2, [0, 0, 1, 1]), (8, 1, [0] * 8)])
def test_each_rank_holds_the_kv_head_its_query_heads_use(tp, kv, expected):
    c = config(heads=8, kv=kv)
    starts = [LlamaShard(c, r, tp).kv_head_start for r in range(tp)]
    assert starts == expected
    for r in range(tp):  # GQA: query head h uses KV head h // (heads / kv)
        shard = LlamaShard(c, r, tp)
        heads = range(r * shard.heads, (r + 1) * shard.heads)
        used = {h // (c.num_attention_heads // kv) for h in heads}
        assert used == set(range(shard.kv_head_start, shard.kv_head_start + shard.kv_heads))


def test_an_uneven_vocab_is_padded_on_the_last_rank():
    c = config(vocab=515)
    shards = [LlamaShard(c, r, 2) for r in range(2)]
    assert [s.vocab_per_rank for s in shards] == [258, 258]
    assert [s.read("lm_head.weight").rows for s in shards] == [(0, 258), (258, 515)]
    assert shards[1].read("lm_head.weight").pad_rows == 258
