"""Mutation check: would the tests notice if the code were wrong?

A test suite that passes proves little by itself: a test that cannot fail passes too. Mutation testing asks the
converse question. Make one small, plausible mistake in the code (a *mutant*), run the tests that claim to cover
it, and expect at least one to fail ("the mutant is killed"). A mutant that survives points at a promise no test
keeps. This project found such holes: parallel runs that *summed* their gradients instead of averaging them passed
every equivalence test, because clipping rescales the gradient to a fixed norm and Adam divides by sqrt(v), so a
factor of 2 left the weights unchanged. The tests now also compare the pre-clip gradient norm and plain-SGD steps;
the mutants below keep them (and a few other promises) honest.

Each mutant is one exact text replacement in one file, with the tests that must catch it. The pattern must occur
exactly once in today's source: when a file changes and a pattern no longer matches, the check stops with an error
that names the mutant, so the list is kept up to date instead of silently testing nothing.

How a run works, for each mutant:
    copy the repository (not .git) to a temporary directory -> apply the edit -> run pytest on the listed tests
    pytest exit 1 (a test failed)  -> killed
    pytest exit 0 (all passed)     -> SURVIVED, the check fails
    anything else (collection error, no tests ran, timeout) -> error, the check fails
A baseline run of the same tests on the unmutated copy must pass first: otherwise every "kill" would mean nothing.
CI skips it (--no-baseline): there the tree is a clean clone on which the whole suite and the long set just passed,
and a copy of it is the same tree.

    python tests/mutation_check.py                  # every mutant: a table of kills, exit 0 only if all are killed
    python tests/mutation_check.py --list           # the mutants, their files and tests
    python tests/mutation_check.py --only dp-sum-instead-of-mean,warmup-shifted-by-one
    python tests/mutation_check.py --jobs 2         # mutants run two at a time (default: 2, or 1 on one core)
    python tests/mutation_check.py --no-baseline    # CI, after the suite passed on this clean clone

The corpora in ../shared/data are found as the tests find them (SHARED_DATA, else next to the repository).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    file: str  # relative to the repository root
    old: str  # exact text, must occur exactly once in the file
    new: str  # what it becomes
    tests: tuple  # pytest node ids (relative to the root) that must catch it
    why: str  # the mistake, in words


PARALLEL = "tests/test_parallel.py"
CLI_FILES = "tests/test_cli.py::test_a_damaged_file_is_one_line_naming_the_file_and_field"
TRAIN = "tests/test_train.py"
EPCP = "tests/test_ep_cp.py"
COMPILE = "tests/test_compile.py"
RECIPE = "tests/test_recipe.py"
RANK0 = (
    "tests/test_rank0_work.py::"
    "test_rank0_work_outlasts_the_collective_timeout_and_gathers_arrive_on_the_cpu"
)

KEPT_PER_SOURCE = (
    "tests/test_data.py::test_kept_per_source_counts_each_source_s_own_documents_in_the_shards"
)

MUTANTS = [
    # --- the gradient's scale: invisible to clipped AdamW, visible to the pre-clip norm and to plain SGD ----------
    Mutant(
        "dp-sum-instead-of-mean",
        "parallel.py",
        "            bucket.buffer.div_(self.comm.size)\n",
        "",
        (
            f"{PARALLEL}::test_data_parallel_equals_single_process",
            f"{TRAIN}::test_data_parallel_two_ranks_match_one_process",
        ),
        "DataParallel sums the bucket gradients over ranks instead of averaging them",
    ),
    Mutant(
        "zero-sum-instead-of-mean",
        "parallel.py",
        "out = out.to(self.shard.dtype).div_(self.comm.size)",
        "out = out.to(self.shard.dtype)",
        (f"{PARALLEL}::test_zero_equals_single_process",),
        "ZeRO's reduce-scatter sums the shard gradients instead of averaging them",
    ),
    Mutant(
        "pipeline-no-micro-batch-mean",
        "model_parallel.py",
        "                    out = out / m\n",
        "",
        (f"{PARALLEL}::test_tensor_and_pipeline_parallel_equal_single_process",),
        "the pipeline sums the micro-batch losses instead of averaging them",
    ),
    Mutant(
        "tp-cross-entropy-sum",
        "model_parallel.py",
        "g *= (valid.to(g.dtype) * grad / count)[:, None]",
        "g *= (valid.to(g.dtype) * grad)[:, None]",
        (f"{PARALLEL}::test_tensor_and_pipeline_parallel_equal_single_process",),
        "the vocabulary-parallel cross-entropy's backward forgets to divide by the token count",
    ),
    Mutant(
        "tp-input-grad-not-reduced",
        "model_parallel.py",
        "        ctx.comm.all_reduce(grad, count=False)\n        return grad, None",
        "        return grad, None",
        (f"{PARALLEL}::test_tensor_and_pipeline_parallel_equal_single_process",),
        "tensor parallel's f operator skips the all-reduce of the input gradient",
    ),
    Mutant(
        "clip-norm-misses-tp-slices",
        "parallel.py",
        "    mesh.tp.all_reduce(sharded)\n",
        "",
        (f"{PARALLEL}::test_tensor_and_pipeline_parallel_equal_single_process",),
        "the global gradient norm counts only this rank's tensor-parallel slices",
    ),
    Mutant(
        "accumulation-no-mean",
        "train.py",
        "objective = objective / n ",
        "objective = objective     ",
        (f"{TRAIN}::test_accumulation_equivalence_one_batch_of_8_equals_4_micro_batches_of_2",),
        "gradient accumulation sums the micro-batch gradients instead of averaging them",
    ),
    # --- schedules, checkpoints, metrics ---------------------------------------------------------------------------
    Mutant(
        "warmup-shifted-by-one",
        "train.py",
        "return max_lr * (step + 1) / warmup_steps",
        "return max_lr * step / warmup_steps",
        (f"{TRAIN}::test_cosine_schedule_lecture_points",),
        "linear warmup starts at 0 (a wasted step) and peaks one step late",
    ),
    Mutant(
        "resume-without-rng-state",
        "machinery/run.py",
        '            checkpoints.set_rng_state(ckpt["rng"][self.dist.rank])\n',
        "            pass\n",
        (f"{TRAIN}::test_resume_restores_the_random_generators",),
        "a resumed run does not restore its random generators",
    ),
    Mutant(
        "newton-schulz-wrong-coefficient",
        "train.py",
        "NEWTON_SCHULZ_COEFFICIENTS = (3.4445, -4.7750, 2.0315)",
        "NEWTON_SCHULZ_COEFFICIENTS = (2.4445, -4.7750, 2.0315)",
        (f"{TRAIN}::test_newton_schulz_gives_the_svds_directions_with_singular_values_near_one",),
        "a slope of 2.4 at 0: the small singular values stay small (0.4), the update no longer orthogonal",
    ),
    Mutant(
        "muon-without-shape-scale",
        "train.py",
        "return newton_schulz(nesterov) * muon_scale(*weight.shape)",
        "return newton_schulz(nesterov)",
        (f"{TRAIN}::test_muon_scale_gives_updates_the_rms_of_adamws",),
        "Muon's update has RMS 1/sqrt(max(rows, cols)), not AdamW's 0.2: AdamW's lr no longer carries over",
    ),
    Mutant(
        "width-transfer-on-the-embedding-too",
        "train.py",
        '{"params": embedding, "weight_decay": weight_decay, "lr_mult": 1.0}',
        '{"params": embedding, "weight_decay": weight_decay, "lr_mult": hidden_mult}',
        (f"{TRAIN}::test_width_transfer_scales_only_the_hidden_matrices_lr_by_base_over_width",),
        "the tied embedding/head's lr x base/width too: not the rule the grid measured",
    ),
    Mutant(
        "width-transfer-inverted",
        "train.py",
        "hidden_mult = lr_base_width / model.config.n_embd if lr_base_width else 1.0",
        "hidden_mult = model.config.n_embd / lr_base_width if lr_base_width else 1.0",
        (f"{TRAIN}::test_width_transfer_scales_only_the_hidden_matrices_lr_by_base_over_width",),
        "width/base: a width-256 model's hidden lr x4 instead of x1/4",
    ),
    Mutant(
        "width-transfer-skips-muon",
        "train.py",
        'groups[0]["muon"] = True  # the hidden matrices',
        "groups[0].update(muon=True, lr_mult=1.0)",
        (f"{TRAIN}::test_width_transfer_scales_only_the_hidden_matrices_lr_by_base_over_width",),
        "Muon's matrices at the full lr under --lr-base-width: not the rule the grid measured",
    ),
    Mutant(
        "loop-ignores-lr-multipliers",
        "train.py",
        'group["lr"] = lr * group["lr_mult"]',
        'group["lr"] = lr',
        (f"{TRAIN}::test_the_loop_steps_each_group_at_the_schedules_lr_times_its_multiplier",),
        "every group at the schedule's lr: --lr-base-width changes nothing",
    ),
    Mutant(
        "zero-muon-keeps-rank-0s-slice",
        "parallel.py",
        "return update[lo : lo + unit.shard_size]",
        "return update[: unit.shard_size]",
        (f"{PARALLEL}::test_muon_under_zero_equals_single_process",),
        "every rank steps its shard by rank 0's slice of the orthogonalised update",
    ),
    Mutant(
        "recall-models-keep-gpt2-init",
        "evaluate.py",
        "    recall_init(net)\n",
        "",
        (
            "tests/test_evaluate.py::test_attention_and_hybrid_recall_every_pair_with_the_recall_recipe",
        ),
        "the recall models start at GPT-2's N(0, 0.02): attention answers with any value of the row",
    ),
    Mutant(
        "recall-gates-start-at-0.95",
        "evaluate.py",
        "                torch.nn.init.zeros_(module.bias)\n",
        "                pass\n",
        (
            "tests/test_evaluate.py::test_attention_and_hybrid_recall_every_pair_with_the_recall_recipe",
        ),
        "linear attention's gates keep model.py's bias of 3: the hybrid never gets the previous token",
    ),
    Mutant(
        "recall-heads-of-16",
        "evaluate.py",
        "RECALL_VOCAB, RECALL_HEADS = 64, 1500, 64, 64, 1",
        "RECALL_VOCAB, RECALL_HEADS = 64, 1500, 64, 64, 4",
        (
            "tests/test_evaluate.py::test_attention_and_hybrid_recall_every_pair_with_the_recall_recipe",
        ),
        "four heads of 16: attention's previous-token head, from RoPE alone, forms too slowly",
    ),
    Mutant(
        "pii-ip-need-misses-one-digit-octets",
        "data.py",
        '"IP": [re.compile(r"\\.\\d{1,3}\\.")]',
        '"IP": [re.compile(r"\\.\\d{2,3}\\.")]',
        ("tests/test_data.py::test_pii_needs_never_skip_a_match",),
        "the cheap search before the IP pattern skips 10.1.2.3: an address left unmasked",
    ),
    Mutant(
        "stream-boilerplate-marks-no-document",
        "machinery/data_at_scale.py",
        '(job, 1, chunk.index, "line_doc.npy"))[found]] = True',
        '(job, 1, chunk.index, "line_doc.npy"))[found]] = False',
        ("tests/test_data.py::test_streaming_equals_in_memory",),
        "the streaming engine splits no document into lines again: its boilerplate stays",
    ),
    Mutant(
        "bits-per-byte-in-nats",
        "evaluate.py",
        "return total_nats / n_bytes / LN2",
        "return total_nats / n_bytes",
        ("tests/test_evaluate.py::test_bits_per_byte_of_the_lecture_example",),
        "bits per byte forgets the nats-to-bits conversion",
    ),
    Mutant(
        "isoflop-tokens-not-c-over-6n",
        "machinery/sweep.py",
        "tokens = budget / (6.0 * n)",
        "tokens = budget / (2.0 * n)",
        ("tests/test_sweep.py::test_isoflop_plan_trains_each_size_for_its_budget",),
        "the sweep trains each size for C/2N tokens instead of C/6N",
    ),
    Mutant(
        "sweep-eval-windows-follow-the-batch",
        "machinery/sweep.py",
        '"--eval-batches": max(1, s.eval_windows // run.batch_size),',
        '"--eval-batches": s.eval_windows // 8,',
        ("tests/test_sweep.py::test_train_command_builds_the_planned_shape_and_schedule",),
        "runs of different batches are scored on different numbers of held-out windows",
    ),
    Mutant(
        "sweep-records-another-command",
        "machinery/sweep.py",
        '"command": shell_command(cmd, settings.threads)',
        '"command": shell_command(train_command(SweepSettings(), run, data_dir, run_dir), settings.threads)',
        ("tests/test_sweep.py::test_a_recorded_point_reruns_alone_to_the_same_loss",),
        "final.jsonl records the default design's command, not the one that ran",
    ),
    Mutant(
        "sweep-heldout-line-fitted",
        "machinery/runs_file.py",
        '        if not (isinstance(record, dict) and record.get("heldout")):\n            runs.append(',
        "        if True:\n            runs.append(",
        ("tests/test_sweep.py::test_load_runs_reads_a_sweeps_final_jsonl",),
        "the held-out prediction run leaks into the fit it is meant to check",
    ),
    Mutant(
        "sweep-seeds-counted-twice",
        "machinery/runs_file.py",
        "    return mean_over_seeds(runs)\n",
        "    return runs\n",
        ("tests/test_sweep.py::test_a_points_seeds_are_fitted_as_their_mean",),
        "`scaling.py fit final.jsonl` fits a point's two seeds as two points, not their mean",
    ),
    Mutant(
        "sweep-second-seed-at-the-worst-size",
        "machinery/sweep.py",
        'best = min(range(len(group)), key=lambda i: group[i]["loss"])',
        'best = max(range(len(group)), key=lambda i: group[i]["loss"])',
        ("tests/test_sweep.py::test_second_seeds_go_to_the_sizes_nearest_each_minimum",),
        "the second seeds go to the sizes farthest from each minimum",
    ),
    Mutant(
        "sweep-seed-sd-of-a-difference",
        "machinery/sweep.py",
        "math.sqrt(np.sum(d**2) / (2 * len(d)))",
        "math.sqrt(np.sum(d**2) / len(d))",
        ("tests/test_sweep.py::test_sweep_recovers_a_known_law_and_predicts_the_held_out_run",),
        "the seed noise is the s.d. of a difference of two runs, not of one run",
    ),
    Mutant(
        "pipeline-bubble-off-by-one",
        "scaling.py",
        "return (stages - 1) / (micro + stages - 1)",
        "return (stages - 1) / (micro + stages)",
        ("tests/test_scaling.py::test_pipeline_bubble",),
        "the bubble formula (p-1)/(m+p-1) loses its -1",
    ),
    # --- the model --------------------------------------------------------------------------------------------------
    Mutant(
        "cached-prompt-mask-off-by-one",
        "model.py",
        "mask = key_pos <= query_pos",
        "mask = key_pos < query_pos",
        ("tests/test_model.py::test_causal_attention_aligns_queries_to_the_last_positions",),
        "a prompt appended to a KV cache does not see its own position",
    ),
    Mutant(
        "rope-ignores-cache-offset",
        "model.py",
        "positions = torch.arange(start, start + T, device=x.device)",
        "positions = torch.arange(T, device=x.device)",
        ("tests/test_model.py::test_kv_cache_gives_the_full_forward_logits",),
        "RoPE rotates cached decoding steps as if they were at position 0",
    ),
    # --- the stability options (issue 48) ---------------------------------------------------------------------------
    Mutant(
        "qk-norm-after-rope",
        "model.py",
        """        if self.q_norm is not None:  # before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        positions = self.positions
        if positions is None:
            start = 0 if cache is None else cache.start
            positions = torch.arange(start, start + T, device=x.device)
        cos, sin = rope_angles(positions, self.head_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
""",
        """        positions = self.positions
        if positions is None:
            start = 0 if cache is None else cache.start
            positions = torch.arange(start, start + T, device=x.device)
        cos, sin = rope_angles(positions, self.head_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
""",
        ("tests/test_model.py::test_max_attention_logit_equals_a_float64_computation",),
        "QK-norm's per-feature gains applied after RoPE's rotation mixed each pair",
    ),
    Mutant(
        "qk-norm-promotes-q-and-k-to-fp32",
        "model.py",
        "return normed.type_as(x) * self.weight.type_as(x)",
        "return normed.type_as(x) * self.weight",
        (
            "tests/test_model.py::"
            "test_qk_norm_keeps_q_and_k_in_the_compute_dtype_under_bf16_autocast",
            "tests/test_model.py::"
            "test_the_residual_stream_and_the_norms_stay_bf16_under_bf16_autocast",
        ),
        "under bf16 autocast RMSNorm's fp32 gain promotes its output (q and k under QK-norm, every matmul input)",
    ),
    # --- the GPU step (issue 47): fused matmuls, the bf16 residual stream -------------------------------------------
    Mutant(
        "fused-qkv-split-in-the-wrong-order",
        "model.py",
        "q, k, v = (t.view(B, T, -1, self.head_dim) for t in qkv)",
        "q, v, k = (t.view(B, T, -1, self.head_dim) for t in qkv)",
        ("tests/test_model.py::test_gqa_expands_kv_heads_in_groups_like_repeat_interleave",),
        "the fused q/k/v output split with k and v swapped (equally wide: the shapes let it through)",
    ),
    Mutant(
        "fused-gate-and-value-swapped",
        "model.py",
        "gate, value = fused_linear(x, self.w1, self.w3)",
        "value, gate = fused_linear(x, self.w1, self.w3)",
        ("tests/test_model.py::test_moe_with_one_expert_top1_equals_the_dense_ffn",),
        "SwiGLU's fused output split with the gate and the value swapped (w1, w3 equally wide)",
    ),
    Mutant(
        "fused-weights-stacked-in-reverse",
        "model.py",
        "F.linear(x, torch.cat(weights))",
        "F.linear(x, torch.cat(weights[::-1]))",
        ("tests/test_model.py::test_fused_projections_equal_separate_matmuls",),
        "fused_linear stacks the weights in reverse: each output piece is another layer's",
    ),
    Mutant(
        "fused-split-by-the-global-sizes",
        "model.py",
        "split([w.shape[0] for w in weights], dim=-1)",
        "split([linear.out_features for linear in linears], dim=-1)",
        (f"{PARALLEL}::test_tp_and_pp_under_bf16_autocast_fused_equal_separate_and_one_process",),
        "the fused output split by the full layers' sizes: a tensor-parallel shard holds only its rows",
    ),
    Mutant(
        "residual-stream-left-in-fp32",
        "model.py",
        "            x = x.to(torch.get_autocast_dtype(device))",
        "            x = x.float()",
        (
            "tests/test_model.py::"
            "test_the_residual_stream_and_the_norms_stay_bf16_under_bf16_autocast",
        ),
        "the embedding's output not cast: an fp32 residual stream under bf16 autocast",
    ),
    Mutant(
        "rmsnorm-mean-square-in-bf16",
        "model.py",
        "        x32 = x.float()\n",
        "        x32 = x\n",
        (
            "tests/test_model.py::test_rmsnorm_takes_the_mean_square_in_fp32_and_returns_the_input_dtype",
        ),
        "RMSNorm's mean square taken in the input's bf16 (8 bits of mantissa) instead of fp32",
    ),
    Mutant(
        "pipeline-receives-the-stream-in-fp32",
        "model_parallel.py",
        "            dtype = torch.get_autocast_dtype(device.type)\n",
        "            pass\n",
        (f"{PARALLEL}::test_tp_and_pp_under_bf16_autocast_fused_equal_separate_and_one_process",),
        "pipeline stages receive the bf16 residual stream into fp32 buffers (the bytes garbled)",
    ),
    Mutant(
        "ablation-fusion-switch-does-nothing",
        "bench/bench_gpu.py",
        "model_lib.fused_linear = original if fused else separate_linears",
        "model_lib.fused_linear = original",
        ("tests/test_bench_gpu.py::test_the_ablation_switches_turn_each_change_off_and_back_on",),
        "the bench's 'separate matmuls' variant still runs the fused ones (its MFU row would measure nothing)",
    ),
    Mutant(
        "qk-norm-gains-drawn-like-matrices",
        "model.py",
        "if weight.dim() > 1:",
        'if not name.endswith("bias"):',
        (
            "tests/test_model.py::"
            "test_qk_norm_with_unit_gains_bounds_every_attention_logit_by_sqrt_head_dim",
        ),
        "the init draws QK-norm's gains N(0, 0.02) like a weight matrix: every logit ~0",
    ),
    Mutant(
        "softcap-without-outer-multiply",
        "model.py",
        "return cap * torch.tanh(logits / cap) if cap else logits",
        "return torch.tanh(logits / cap) if cap else logits",
        ("tests/test_model.py::test_logit_softcap_bounds_the_logits_and_equals_the_formula",),
        "the soft-cap forgets to scale tanh back by c: logits in (-1, 1)",
    ),
    Mutant(
        "z-loss-counts-ignored-positions",
        "model.py",
        "log_z = flat.logsumexp(-1)[targets.reshape(-1) != -1]",
        "log_z = flat.logsumexp(-1)",
        (
            "tests/test_model.py::"
            "test_z_loss_equals_the_formula_over_the_positions_with_a_target_and_its_gradient",
        ),
        "z-loss averages log Z^2 over padding (-1) positions too",
    ),
    Mutant(
        "attention-probe-sees-the-future",
        "machinery/attention_probe.py",
        "scores.masked_fill(~visible, -math.inf).amax()",
        "scores.amax()",
        ("tests/test_model.py::test_max_attention_logit_equals_a_float64_computation",),
        "the largest-logit probe counts keys after the query, which softmax never sees",
    ),
    Mutant(
        "z-loss-allowed-under-pp",
        "machinery/run.py",
        '("z_loss", ("tp", "pp", "cp"),',
        '("z_loss", ("tp", "cp"),',
        ("tests/test_train.py::test_stability_options_a_layout_would_get_wrong_are_one_line",),
        "the pipeline's last stage silently trains without the z-loss it was asked for",
    ),
    Mutant(
        "hf-exports-a-soft-capped-model",
        "machinery/hf.py",
        "config.qk_norm or config.logit_softcap,",
        "config.qk_norm,",
        ("tests/test_hf.py::test_qk_norm_or_a_logit_softcap_is_refused_in_one_line",),
        "a soft-capped model exports as a Llama whose logits are not capped",
    ),
    # --- the Hugging Face bridge: transformers' LlamaForCausalLM and AutoTokenizer are the oracles --------------------
    Mutant(
        "hf-export-skips-rope-permutation",
        "machinery/hf.py",
        "tensor = interleaved_to_halves(tensor, rope_heads(name, cfg))",
        "tensor = tensor",
        ("tests/test_hf.py::test_logits_equal_transformers_on_random_and_real_ids",),
        "export keeps our interleaved RoPE rows, which HF rotates as halves",
    ),
    Mutant(
        "hf-tie-flag-flipped",
        "machinery/hf.py",
        '"tie_word_embeddings": config.tie_embeddings,',
        '"tie_word_embeddings": not config.tie_embeddings,',
        ("tests/test_hf.py::test_logits_equal_transformers_on_random_and_real_ids",),
        "config.json says the LM head is tied when it is not, and the reverse",
    ),
    Mutant(
        "hf-tokenizer-gpt2-regex",
        "machinery/hf.py",
        '{"Regex": theirs}',
        '{"Regex": bpe.GPT2_PATTERN}',
        ("tests/test_hf.py::test_autotokenizer_ids_equal_ours_on_the_corpora",),
        "tokenizer.json pre-tokenizes with GPT-2's regex whatever the tokenizer's own is",
    ),
    Mutant(
        "hf-tokenizer-counted-repeat-not-atomic",
        "machinery/hf.py",
        "    theirs = hf_regex(tokenizer.pattern)\n",
        "    theirs = tokenizer.pattern\n",
        (
            "tests/test_hf.py::test_autotokenizer_ids_equal_ours_on_numbers_contractions_and_odd_whitespace",
        ),
        "tokenizer.json keeps GPT-4's \\p{N}{1,3}+, which Oniguruma reads as runs of 1-3 digits",
    ),
    # --- tokenizer, dedup, data -------------------------------------------------------------------------------------
    Mutant(
        "bpe-tie-to-smallest-pair",
        "bpe.py",
        "_REVERSE_BYTES = {b: chr(256 - b) for b in range(256)}",
        "_REVERSE_BYTES = {b: chr(1 + b) for b in range(256)}",
        ("tests/test_bpe.py::test_lecture_example_and_tie_break",),
        "the fast BPE trainer breaks count ties toward the smallest byte pair, not the greatest",
    ),
    Mutant(
        "bpe-naive-tie-to-smallest-pair",
        "bpe.py",
        "return max(pair_counts, key=lambda p: (pair_counts[p], token_bytes[p[0]], token_bytes[p[1]]))",
        "return min(pair_counts, key=lambda p: (-pair_counts[p], token_bytes[p[0]], token_bytes[p[1]]))",
        ("tests/test_bpe.py::test_fast_trainer_equals_textbook_trainer",),
        "the teaching BPE trainer breaks count ties toward the smallest byte pair",
    ),
    Mutant(
        "bpe-stale-heap-entry-dropped",
        "bpe.py",
        "heapq.heappush(heap, (-pair_counts[pair], key, pair))",
        "pass",
        ("tests/test_bpe.py::test_fast_trainer_equals_textbook_trainer",),
        "the fast trainer drops a popped heap entry whose count fell instead of pushing it back",
    ),
    Mutant(
        "bpe-rewrite-window-misses-left-neighbour",
        "bpe.py",
        "start = first - 1 if first else 0",
        "start = first",
        ("tests/test_bpe.py::test_fast_trainer_equals_textbook_trainer",),
        "the fast trainer recounts from the first occurrence: the pair before it keeps its old count",
    ),
    Mutant(
        "bpe-rewrite-window-misses-right-neighbour",
        "bpe.py",
        "word.rfind(pair) + 3",
        "word.rfind(pair) + 2",
        ("tests/test_bpe.py::test_fast_trainer_equals_textbook_trainer",),
        "the fast trainer recounts too short a stretch: the pair after the last merge keeps its old count",
    ),
    Mutant(
        "bpe-word-cut-at-every-space",
        "bpe.py",
        'WORD_CUT = re.compile(r" (?<=[!-~] )")',
        'WORD_CUT = re.compile(r" ")',
        ("tests/test_bpe.py::test_word_cut_keeps_tiktokens_ids_around_any_whitespace",),
        "the encoder cuts text into words at every space, also next to other whitespace",
    ),
    Mutant(
        "bpe-word-cut-any-pattern",
        "bpe.py",
        "self.cuts_words = self.pattern in (GPT2_PATTERN, GPT4_PATTERN)",
        "self.cuts_words = True",
        ("tests/test_bpe.py::test_custom_pattern_is_not_cut_at_spaces",),
        "the encoder cuts text at spaces under a custom regex whose pieces may hold spaces",
    ),
    Mutant(
        "bpe-encode-stale-right-pair",
        "bpe.py",
        "            pair_ranks[i] = ranks.get(merged + parts[i + 1], max_rank)\n",
        "            pass\n",
        (
            "tests/test_bpe.py::test_pure_python_equals_tiktoken_on_arbitrary_unicode",
            "tests/test_bpe.py::test_pure_python_encoder_equals_tiktoken_on_every_corpus",
        ),
        "after a merge the encoder keeps the old rank of the pair to the right of the new part",
    ),
    Mutant(
        "bpe-encode-stale-left-pair",
        "bpe.py",
        "            pair_ranks[i - 1] = ranks.get(parts[i - 1] + merged, max_rank)\n",
        "            pass\n",
        (
            "tests/test_bpe.py::test_pure_python_equals_tiktoken_on_arbitrary_unicode",
            "tests/test_bpe.py::test_pure_python_encoder_equals_tiktoken_on_every_corpus",
        ),
        "after a merge the encoder keeps the old rank of the pair to the left of the new part",
    ),
    Mutant(
        "bpe-letter-word-loses-its-space",
        "bpe.py",
        'self.encode_piece(b" " + word.encode("ascii"))',
        'self.encode_piece(word.encode("ascii"))',
        (
            "tests/test_bpe.py::test_word_cut_keeps_tiktokens_ids_around_any_whitespace",
            "tests/test_bpe.py::test_pure_python_encoder_equals_tiktoken_on_every_corpus",
        ),
        "a new word of letters is encoded without the space before it",
    ),
    Mutant(
        "bpe-cache-limit-keeps-the-pieces",
        "bpe.py",
        "            self._piece_ids.clear()\n",
        "            pass\n",
        ("tests/test_bpe.py::test_cache_is_bounded_and_does_not_change_ids",),
        "past CACHE_LIMIT the encoder clears its words but keeps every piece it ever saw",
    ),
    Mutant(
        "train-or-reuse-ignores-the-command",
        "machinery/sweep.py",
        'finished = stamp.is_file() and stamp.read_text(encoding="utf-8") == wanted',
        "finished = stamp.is_file()",
        (
            "tests/test_sweep.py::test_train_or_reuse_keeps_finished_runs_and_a_diverged_one_only_where_it_is_a_result",
        ),
        "a finished run is reused although its command changed",
    ),
    Mutant(
        "train-or-reuse-takes-a-diverged-point",
        "machinery/sweep.py",
        "if finished and (loss is not None or diverged_ok):",
        "if finished:",
        (
            "tests/test_sweep.py::test_train_or_reuse_keeps_finished_runs_and_a_diverged_one_only_where_it_is_a_result",
        ),
        "the sweep reuses a run on disk that has no finite loss as a point",
    ),
    Mutant(
        "recipe-diverged-run-is-a-failure",
        "machinery/recipe.py",
        "diverged_ok=True",
        "diverged_ok=False",
        ("tests/test_recipe.py::test_a_diverged_run_is_a_result_kept_and_reused",),
        "the recipe stops at a run that diverged instead of counting it",
    ),
    Mutant(
        "minhash-modulus-2-to-the-32",
        "dedup.py",
        "% np.uint64(PRIME)",
        "% np.uint64(_HASH_RANGE)",
        ("tests/test_dedup.py::test_universal_hash_is_exact_against_python_integers",),
        "the exact MinHash hash reduces modulo 2^32 instead of the prime p",
    ),
    Mutant(
        "minhash-fast-path-modulus",
        "dedup.py",
        "shifted = [(int(a) << shift) % PRIME",
        "shifted = [(int(a) << shift) % _HASH_RANGE",
        ("tests/test_dedup.py::test_fast_float_hash_is_exact_including_boundary_residues",),
        "the fast MinHash path's coefficients a*2^(11j) are reduced modulo 2^32, not p",
    ),
    Mutant(
        "minhash-residue-read-at-a-gap-edge",
        "dedup.py",
        "(self.b.astype(np.float64) + 0.5) / PRIME",
        "self.b.astype(np.float64) / PRIME",
        (
            "tests/test_dedup.py::test_signatures_are_todays_bit_for_bit",
            "tests/test_dedup.py::test_signature_minimum_is_exact_when_a_document_holds_a_root",
        ),
        "the fast MinHash path reads residue r at r/p, on a gap's edge, not mid-gap at (r + 1/2)/p",
    ),
    Mutant(
        "pair-jaccard-runs-cross-documents",
        "dedup.py",
        "    first[offsets[:-1]] = True\n",
        "",
        ("tests/test_dedup.py::test_pair_jaccard_is_the_jaccard_of_the_shingle_sets",),
        "exact verification drops a document's first shingle when it equals the previous document's last",
    ),
    Mutant(
        "word-hash-sums-read-one-early",
        "dedup.py",
        "edges = prefix[bounds].reshape(-1, 2)",
        "edges = prefix[bounds - 1].reshape(-1, 2)",
        ("tests/test_dedup.py::test_signatures_are_todays_bit_for_bit",),
        "the vectorised word hash reads its prefix sums one character early: every signature moves",
    ),
    Mutant(
        "short-shingle-folds-a-word-past-its-document",
        "dedup.py",
        "live = np.repeat(lengths > j, per_doc)",
        "live = np.repeat(lengths >= j, per_doc)",
        ("tests/test_dedup.py::test_fast_signatures_equal_the_reference_in_python_integers",),
        "the shingle of a document shorter than n folds in the next document's first word",
    ),
    Mutant(
        "val-documents-leak-into-train",
        "machinery/data_at_scale.py",
        "    return alive & ~is_val, is_val\n",
        "    return alive, is_val\n",
        ("tests/test_data.py::test_prepare_tokens_match_the_tokenizer_and_the_text",),
        "the validation documents are also trained on",
    ),
    Mutant(
        "kept-whole-marker-cut-by-a-block",
        "machinery/data_at_scale.py",
        "        cut = tail.start() if tail else len(last)\n",
        "        cut = len(last)\n",
        ("tests/test_data.py::test_block_stream_cuts_the_pieces_of_chunk_document",),
        "an <|endoftext|> cut in two by a block's end is not read whole: two documents run together",
    ),
    Mutant(
        "kept-tokens-counted-for-the-first-source",
        "machinery/in_memory.py",
        '        kept[names[source]][split]["tokens"] += tokens\n',
        '        kept[names[0]][split]["tokens"] += tokens\n',
        (KEPT_PER_SOURCE,),
        "every source's kept tokens are counted for the first source: the per-source summary lies",
    ),
    Mutant(
        "kept-val-tokens-read-from-train-on-the-stream",
        "machinery/data_at_scale.py",
        '(c.source, split, r[split]["documents"], r[split]["tokens"])',
        '(c.source, split, r[split]["documents"], r["train"]["tokens"])',
        (KEPT_PER_SOURCE,),
        "the streaming engine counts a chunk's train tokens as its val tokens too",
    ),
    Mutant(
        "val-data-stripped-on-the-stream",
        "machinery/data_at_scale.py",
        "    docs = val_documents(job)\n    starts = _encode_into(",
        "    docs = [d.strip() for d in val_documents(job)]\n    starts = _encode_into(",
        ("tests/test_data.py::test_val_data_is_the_file_verbatim_and_its_overlap_is_reported",),
        "the streaming engine strips the --val-data documents: the val split is no longer the file's bytes",
    ),
    # --- classifiers: a message never on both sides of the split, each filter its own funnel row ---
    Mutant(
        "held-out-split-by-text",
        "machinery/classify_corpora.py",
        "if is_held_out(msgid)",
        "if is_held_out(text)",
        (
            "tests/test_classify.py::test_shipped_model_covers_languages_and_no_message_is_on_both_sides",
        ),
        "held out by each translation's text: one message trains in French and is tested in German",
    ),
    Mutant(
        "compiled-context-kept",
        "machinery/classify_corpora.py",
        '(key.split("\\x04")[-1], catalog[key])',
        "(key, catalog[key])",
        ("tests/test_classify.py::test_compiled_catalogs_read_as_their_sources",),
        "a .mo file's msgid keeps its context: 'month\\x04May' trains as English text",
    ),
    Mutant(
        "language-reasons-in-the-quality-row",
        "machinery/cleaning.py",
        '            lambda r: r == "low_quality",\n',
        '            lambda r: r == "low_quality" or r.startswith("language_"),\n',
        ("tests/test_classify.py::test_lang_and_quality_rows_and_engines_write_the_same_bytes",),
        "the quality classifier's row also counts the language identifier's rejections",
    ),
    Mutant(
        "classifier-nan-weights-trusted",
        "classify.py",
        "        if not bool(torch.isfinite(tensor).all()):\n",
        "        if False:\n",
        (
            "tests/test_classify.py::test_saved_file_round_trips_and_bad_files_are_refused",
            f"{CLI_FILES}[data.py prepare --data {{corpus}} --quality-threshold 0.5 --quality-model {{q_nan}}]",
        ),
        "a classifier file with NaN or infinite weights is trusted: the quality filter keeps every document",
    ),
    # --- object stores: a reader must never see half a dataset, nor a range read lose a line ---------------------
    Mutant(
        "store-manifest-published-first",
        "machinery/store.py",
        '    names += ["manifest.json"]',
        '    names.insert(0, "manifest.json")',
        ("tests/test_data_objstore.py::test_failed_publish_leaves_no_manifest",),
        "the manifest is copied to OUT/ before the shards: a failed publish leaves a dataset that looks finished",
    ),
    Mutant(
        "jsonl-range-seek-off-by-one",
        "machinery/formats.py",
        "            f.seek(start - 1)\n",
        "            f.seek(start)\n",
        ("tests/test_data_objstore.py::test_jsonl_byte_ranges_over_s3_read_every_line_once",),
        "a byte range starting on a line start skips that line",
    ),
    Mutant(
        "store-fingerprint-ignores-size",
        "machinery/formats.py",
        'f"{uri}:{size}:{mtime_ns}"',
        'f"{uri}:{mtime_ns}"',
        ("tests/test_data_objstore.py::test_file_uris_and_globs",),
        "an object rewritten with its old mtime is taken for the cached dataset",
    ),
    Mutant(
        "join-last-range-dropped",
        "machinery/data_at_scale.py",
        "    return list(zip(bounds[:-1], bounds[1:]))\n",
        "    return list(zip(bounds[:-1], bounds[1:]))[:-1]\n",
        ("tests/test_data.py::test_streaming_joins_over_many_ranges_equal_in_memory",),
        "the joins skip the last key range: its duplicates, boilerplate lines and near-copies stay",
    ),
    Mutant(
        "union-find-per-id-range",
        "machinery/data_at_scale.py",
        '    verified = _range_results(job, "near-verified", id_ranges, np.zeros((0, 2), dtype=np.int64))\n'
        "    members = np.unique(verified)\n"
        "    union_find = dedup.UnionFind(len(members))\n"
        "    for i, j in np.searchsorted(members, verified).tolist():\n"
        "        union_find.union(i, j)\n"
        "    drop = [m for cluster in union_find.clusters() for m in cluster[1:]]\n"
        '    _save_array(_work(job, "near_drop.npy"), np.sort(members[drop]).astype(np.int64))\n',
        "    drop = []\n"
        "    for r in id_ranges:\n"
        '        verified = _range_results(job, "near-verified", [r], np.zeros((0, 2), dtype=np.int64))\n'
        "        members = np.unique(verified)\n"
        "        union_find = dedup.UnionFind(len(members))\n"
        "        for i, j in np.searchsorted(members, verified).tolist():\n"
        "            union_find.union(i, j)\n"
        "        drop += [int(members[m]) for cluster in union_find.clusters() for m in cluster[1:]]\n"
        '    _save_array(_work(job, "near_drop.npy"), np.unique(np.array(drop, dtype=np.int64)))\n',
        ("tests/test_data.py::test_streaming_joins_over_many_ranges_equal_in_memory",),
        "near-dup clusters resolved per range of ids: C~A in one range, C~B in another, and B survives",
    ),
    Mutant(
        "join-range-file-named-by-position",
        "machinery/data_at_scale.py",
        'f"{name}-{low:016x}-{high:016x}.npy"',
        'f"{name}-{low * 1000 // 2**64}.npy"',
        ("tests/test_data.py::test_killed_join_resumes_from_its_finished_ranges",),
        "a range's file named by where it starts: a rerun cut into other ranges takes another run's file",
    ),
    # --- the CUDA path (issue 22), shown on the meta device: placement and host syncs ---------------------------
    Mutant(
        "zero-step-left-on-the-cpu",
        "machinery/parallelize.py",
        "first.to(u.shard.device, copy=True) if torch.is_tensor(first)",
        "first.clone() if torch.is_tensor(first)",
        (f"{PARALLEL}::test_zero_optimizer_state_loads_onto_the_shards_device_step_included",),
        "a resumed ZeRO run keeps AdamW's step on the CPU: fused AdamW on CUDA fails at the next step",
    ),
    Mutant(
        "tp-head-made-on-the-cpu",
        "model_parallel.py",
        "bias=False, device=model.lm_head.weight.device\n",
        "bias=False\n",
        (f"{PARALLEL}::test_tensor_parallel_untied_head_is_created_on_the_models_device",),
        "--tp with untied embeddings builds its padded LM head on the CPU",
    ),
    Mutant(
        "host-sync-in-every-forward",
        "model.py",
        'if idx.device.type == "cpu" and idx.numel():',
        "if idx.numel():",
        (
            "tests/test_model.py::test_forward_backward_and_generate_on_another_device_never_read_values_back",
        ),
        "the id-range check reads min and max back from the GPU: two device-to-host syncs per forward",
    ),
    Mutant(
        "mfu-over-one-device",
        "train.py",
        "    return tokens_per_s * flops_per_token / (peak_flops * devices)\n",
        "    return tokens_per_s * flops_per_token / peak_flops\n",
        (f"{TRAIN}::test_mfu_is_per_device_at_world_1_and_2_and_pp_trains_under_autocast",),
        "MFU is every rank's tokens over one device's peak: 8 GPUs at 40% print 320%",
    ),
    # issue 38: runs that share a folder, and the launch environment
    Mutant(
        "lock-passed-to-forked-workers",
        "machinery/fileio.py",
        "fcntl.lockf(fd, how)",
        "fcntl.flock(fd, how)",
        (
            "tests/test_concurrency.py::test_hold_refuses_in_the_callback_and_survives_a_killed_holder",
        ),
        "a flock, which forked workers inherit: a killed prepare's surviving worker keeps it",
    ),
    Mutant(
        "prepare-without-the-lock",
        "machinery/dataset.py",
        "    if plan.reuse:\n        yield plan\n        return\n    lock = ",
        "    if True:\n        yield plan\n        return\n    lock = ",
        ("tests/test_concurrency.py::test_two_prepares_of_one_recipe_take_turns",),
        "two prepares of one output run at once in the same work and temporary folders",
    ),
    Mutant(
        "local-rank-unchecked",
        "machinery/launch.py",
        '    launch_variable("LOCAL_RANK", 0, world - 1, "0")\n',
        "",
        ("tests/test_cli.py::test_bad_launch_environment_is_one_line_naming_the_variable",),
        "LOCAL_RANK=x is not refused before the process group starts",
    ),
    Mutant(
        "auto-engine-always-streams",
        "machinery/data_at_scale.py",
        '    if engine == "memory" or small:',
        '    if engine == "memory":',
        (
            "tests/test_data_at_scale.py::"
            "test_auto_engine_runs_the_reference_for_small_inputs_and_streams_above",
        ),
        "the default prepare streams small inputs: the reference engine a learner reads never runs",
    ),
    # issue 38: files read from outside, checked field by field before use
    Mutant(
        "shard-index-reads-outside-the-folder",
        "machinery/hf.py",
        'lambda name: pathlib.PurePath(name).name == name != "..",',
        "lambda name: True,",
        (CLI_FILES,),
        "a shard index naming ../other/model.safetensors loads weights from outside the model folder",
    ),
    Mutant(
        "checkpoint-fields-unchecked",
        "train.py",
        "            check_checkpoint_fields(ckpt)\n",
        "",
        (CLI_FILES,),
        "a checkpoint whose model is a list or whose tokenizer_json is a number is a traceback later",
    ),
    Mutant(
        "checkpoint-int-weights-accepted",
        "train.py",
        "lambda dtype: dtype.is_floating_point)",
        "lambda dtype: True)",
        (CLI_FILES,),
        "int64 weights are exported and trained as if they were a model",
    ),
    # --- attention's cost (issue 37): the online softmax, the causal tiles, the linear layer's gate -----------
    Mutant(
        "flash-sum-not-rescaled",
        "model.py",
        "l = rescale * l + p.sum(-1)",
        "l = l + p.sum(-1)",
        ("tests/test_model.py::test_flash_attention_equals_sdpa_and_the_formula_with_gradients",),
        "the running softmax sum keeps terms relative to an old max when a new tile raises it",
    ),
    Mutant(
        "flash-causal-mask-off-by-one",
        "model.py",
        "s = s.masked_fill(cols > rows, -math.inf)",
        "s = s.masked_fill(cols >= rows, -math.inf)",
        ("tests/test_model.py::test_flash_attention_equals_sdpa_and_the_formula_with_gradients",),
        "the causal tile mask hides each query's own key",
    ),
    Mutant(
        "flash-sum-in-input-dtype",
        "model.py",
        "l = rescale * l + p.sum(-1)",
        "l = (rescale * l + p.sum(-1)).to(v_tile.dtype)",
        ("tests/test_model.py::test_flash_attention_in_bf16_is_as_accurate_as_sdpa",),
        "under bf16 the running softmax sum is rounded to 8 bits at every key tile",
    ),
    Mutant(
        "linear-recurrence-without-gate",
        "model.py",
        "S = log_a[:, :, t, None, None].exp() * S + ",
        "S = S + ",
        ("tests/test_model.py::test_linear_attention_recurrent_and_chunked_forms_agree",),
        "the token-by-token form never forgets: generation drifts from the chunked form training used",
    ),
    Mutant(
        "linear-state-not-carried-into-generation",
        "model.py",
        "            cache.state = state\n",
        "            pass\n",
        (
            "tests/test_model.py::test_generate_with_kv_cache_and_recurrent_state_equals_the_full_forward",
        ),
        "each generated token starts a linear layer from an empty state",
    ),
    # --- expert parallel and context parallel (model_parallel.py sections 4 and 5) ---------------
    Mutant(
        "ep-combine-without-inverse-permutation",
        "model_parallel.py",
        "back = out.view(E // n, n, cap, C).transpose(0, 1).reshape(n, -1)",
        "back = out.reshape(n, -1)",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "expert outputs sent back in expert-major order: ranks get others' tokens' outputs",
    ),
    Mutant(
        "ep-expert-gradient-not-divided",
        "model_parallel.py",
        "p.register_hook(lambda g: g / n)",
        "p.register_hook(lambda g: g)",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "an expert's gradient sums the losses of n ranks: n times the one-process gradient",
    ),
    Mutant(
        "ring-attention-without-rescale",
        "model_parallel.py",
        "acc[..., rows, :] * rescale[..., None] + update",
        "acc[..., rows, :] + update",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "the running output kept across K/V blocks without the online-softmax rescale",
    ),
    Mutant(
        "ring-skips-the-wrong-blocks",
        "model_parallel.py",
        "    if source < rank:\n",
        "    if source > rank:\n",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "an earlier rank's block treated as a later one's: visible keys skipped, masked ones seen",
    ),
    Mutant(
        "ring-keeps-the-score-block",
        "model_parallel.py",
        # the backward's unpacking takes the extra tensor too, so only the memory check can see it
        "ctx.save_for_backward(q, k, v, out, m + l.log())\n        ctx.comm = comm\n"
        "        return out\n\n    @staticmethod\n    def backward(ctx, dout):\n"
        "        q, k, v, out, lse = ctx.saved_tensors\n",
        "ctx.save_for_backward(q, k, v, out, m + l.log(), p)\n        ctx.comm = comm\n"
        "        return out\n\n    @staticmethod\n    def backward(ctx, dout):\n"
        "        q, k, v, out, lse, _ = ctx.saved_tensors\n",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "ring attention keeps a (T/n)^2 probability block for backward: more memory than no CP",
    ),
    # issue 32: --compile in every layout, rank-0-only work, gathers, TP's bytes
    Mutant(
        "zero3-compiles-the-whole-model",
        "machinery/run.py",
        "    if not per_block:\n",
        "    if True:\n",
        (f"{COMPILE}::test_zero3_compiled_in_one_process_evaluates_and_equals_eager",),
        "--zero 3 --compile compiles the wrapper: eval rebuilds views of a freed buffer",
    ),
    Mutant(
        "compile-step-averaged-into-the-rate",
        "machinery/run.py",
        "if self.cfg.compile and not self.compiled:",
        "if False:",
        (f"{COMPILE}::test_progress_after_the_compile_step_reports_the_true_rate",),
        "the compile step starts the smoothed step time: ~0 tok/s for tens of lines",
    ),
    Mutant(
        "tp-bytes-counted-in-backward-too",
        "model_parallel.py",
        "ctx.comm.all_reduce(grad, count=False)",
        "ctx.comm.all_reduce(grad)",
        (RANK0,),
        "f's backward all-reduce counted twice (a dict updated in a traced backward)",
    ),
    Mutant(
        "tp-bytes-of-f-not-counted",
        "model_parallel.py",
        "for itemsize in (x.element_size(), g_itemsize) * 2:",
        "for itemsize in (g_itemsize,) * 2:",
        (RANK0,),
        "f's gradient all-reduce is left out of TP's communicated bytes",
    ),
    Mutant(
        "byte-counter-inside-the-compiled-block",
        "model_parallel.py",
        "block.register_forward_pre_hook(_count_block_traffic(comm))",
        "block.attn.register_forward_pre_hook(_count_block_traffic(comm))",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "TP's bytes counted inside the compiled block: a recompile per call, then eager",
    ),
    Mutant(
        "rank0-work-waited-in-the-short-timeout",
        "parallel.py",
        "dist.barrier(group=self.patient)",
        "dist.barrier()",
        (RANK0,),
        "waiting for rank 0's save under PARALLEL_TIMEOUT_S: a slow save kills it",
    ),
    Mutant(
        "gpu-tensors-through-all-gather-object",
        "machinery/parallelize.py",
        "dist.all_gather_object(parts, _to_cpu(local)",
        "dist.all_gather_object(parts, local",
        (RANK0,),
        "pipeline stages pickle CUDA tensors: they unpickle onto the sender's GPU",
    ),
    # issue 32: the slow paths (K/V copies for GQA, fp32 copies of the logits, host reads per step)
    Mutant(
        "gqa-kv-copied-on-the-cpu",
        "model.py",
        '"cpu": ((torch.float32, torch.float64, torch.bfloat16, torch.float16), True),',
        '"cpu": ((), True),',
        ("tests/test_model.py::test_gqa_reads_kv_heads_in_place_and_equals_the_copy",),
        "K/V repeated to n_head heads where the CPU's kernel reads the groups: group x the K/V kept",
    ),
    Mutant(
        "flash-gqa-heads-paired-modulo",
        "model.py",
        "q.unflatten(1, (self.n_kv_head, -1))",
        "q.unflatten(1, (-1, self.n_kv_head)).transpose(1, 2)",
        (
            "tests/test_model.py::test_flash_in_the_model_equals_sdpa_with_gqa_outputs_and_gradients",
        ),
        "the flash path's groups pair query head j with kv head j % h_kv, not j // group",
    ),
    Mutant(
        "logits-returned-in-fp32",
        "model.py",
        "logits = self.head(x)  # (B, T, V)",
        "logits = self.head(x).float()  # (B, T, V)",
        (
            "tests/test_model.py::test_the_loss_upcasts_the_logits_once_and_returns_them_in_the_compute_dtype",
        ),
        "the logits upcast for the caller too: a full fp32 (B, T, V) kept alive between steps",
    ),
    Mutant(
        "tp-loss-extra-fp32-copy",
        "model_parallel.py",
        "probs.sub_(row_max[:, None])",
        "probs = probs - row_max[:, None]",
        ("tests/test_parallel.py::test_vocab_parallel_loss_makes_one_fp32_copy_and_no_host_read",),
        "TP's cross-entropy shifts the logits out of place: a second fp32 (N, V/t) tensor",
    ),
    Mutant(
        "tp-loss-backward-boolean-mask",
        "model_parallel.py",
        "g[rows, local_t] -= owned.to(g.dtype)",
        "g[rows[owned], local_t[owned]] -= 1.0",
        ("tests/test_parallel.py::test_vocab_parallel_loss_makes_one_fp32_copy_and_no_host_read",),
        "TP's loss backward indexes by a boolean mask: a nonzero, the host waits for the GPU",
    ),
    Mutant(
        "loss-item-per-micro-batch",
        "train.py",
        "loss_sum += loss.detach().float()",
        "loss_sum += loss.item()",
        (f"{TRAIN}::test_an_optimizer_step_reads_the_device_back_once",),
        "the loss read back after every micro-batch: a host sync per backward",
    ),
    Mutant(
        "grad-norm-read-apart-from-the-loss",
        "train.py",
        "loss_value, stop_any, grad_norm = torch.cat([reduced, grad_norm.view(1)]).tolist()",
        "(loss_value, stop_any), grad_norm = reduced.tolist(), grad_norm.item()",
        (f"{TRAIN}::test_an_optimizer_step_reads_the_device_back_once",),
        "the grad norm read on its own: two host syncs per optimizer step",
    ),
    Mutant(
        "stop-flag-uploaded-from-the-host",
        "train.py",
        "stop = torch.full((), float(run.stop_requested), device=run.device)",
        "stop = torch.tensor(float(run.stop_requested), device=run.device)",
        (f"{TRAIN}::test_an_optimizer_step_reads_the_device_back_once",),
        "the stop flag copied from the host each step: a blocking upload, a second sync",
    ),
    Mutant(
        "ep-slots-sent-in-fp32",
        "model.py",
        "            x = x.to(torch.get_autocast_dtype(device))",
        "            x = x.float()",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "the residual stream left fp32 under bf16: EP dispatches fp32 slots, twice the bytes",
    ),
    # issue 36: expert parallel under ZeRO-1/2
    Mutant(
        "ep-zero-experts-sharded-over-dp",
        "machinery/parallelize.py",
        "edp = wrapped.edp or self.mesh.dp",
        "edp = self.mesh.dp",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "expert slices sharded over every dp rank: ranks holding other experts sum into them",
    ),
    Mutant(
        "ep-zero-expert-norm-added-over-ep-twice",
        "machinery/parallelize.py",
        "mesh = self.mesh if self.edp is None else None",
        "mesh = self.mesh",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "ZeRO's expert squares, already summed over dp, summed again over the expert group",
    ),
    Mutant(
        "zero-broadcasts-expert-slices-over-dp",
        "parallel.py",
        "group = comm_of(t) if comm_of else comm\n",
        "group = comm\n",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "ZeRO's start copies rank 0's expert slices over every dp rank's own experts",
    ),
    Mutant(
        "zero-expert-moments-gathered-over-dp",
        "machinery/parallelize.py",
        "u.comm.all_gather(full, value.contiguous())",
        "self.comm.all_gather(full, value.contiguous())",
        (f"{EPCP}::test_expert_and_context_parallel_equal_one_process_on_2_ranks",),
        "a checkpoint gathers an expert unit's optimizer state over dp, not the ranks sharing it",
    ),
    # issue 43: a lock file planted as a link to a victim
    Mutant(
        "lock-follows-a-symbolic-link",
        "machinery/fileio.py",
        "os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK",
        "os.O_RDWR | os.O_CREAT | os.O_NONBLOCK",
        (
            "tests/test_concurrency.py::test_hold_refuses_a_lock_path_that_is_not_a_regular_file_and_changes_nothing",
            "tests/test_concurrency.py::test_prepare_and_train_refuse_a_planted_lock_in_one_line",
        ),
        "the lock file is opened through a symbolic link: our pid overwrites the link's target",
    ),
    # issue 48: the recipe's measurements
    Mutant(
        "z-loss-in-the-validation-loss",
        "model.py",
        "if self.config.z_loss and self.training:",
        "if self.config.z_loss:",
        (
            "tests/test_model.py::"
            "test_z_loss_equals_the_formula_over_the_positions_with_a_target_and_its_gradient",
        ),
        "the z-loss run's validation loss carries z log Z^2: not comparable with a plain run's",
    ),
    Mutant(
        "count-params-misses-qk-norm-gains",
        "scaling.py",
        "attention += 2 * config.head_dim  # q's and k's gains",
        "attention += 0 * config.head_dim  # q's and k's gains",
        ("tests/test_model.py::test_param_counts_match_the_closed_form",),
        "a QK-norm model's closed-form count misses its two head_dim gains per layer",
    ),
    Mutant(
        "recipe-branch-starts-a-step-late",
        "machinery/recipe.py",
        "return {L: L - int(round(s.decay_fraction * L)) for L in lengths}",
        "return {L: L - int(round(s.decay_fraction * L)) + 1 for L in lengths}",
        (
            f"{RECIPE}::test_each_wsd_branch_resumes_a_checkpoint_the_stable_run_keeps_and_decays_from_there",
        ),
        "a WSD branch resumes a step after its decay began: one step at a rate the schedule never had",
    ),
    Mutant(
        "recipe-sigmas-over-the-smaller-spread",
        "machinery/recipe.py",
        "worst = max(a_sd, b_sd)",
        "worst = min(a_sd, b_sd)",
        (f"{RECIPE}::test_report_computes_each_effect_from_the_runs",),
        "an effect counted in the smaller seed spread: Muon's gap looks twice as sure",
    ),
    Mutant(
        "recipe-stability-trains-its-own-baseline",
        "machinery/recipe.py",
        'optimizer_job(s, "adamw", rate, k, args, _slug(tool) if args else "")',
        'optimizer_job(s, "adamw", rate, k, args, _slug(tool))',
        (f"{RECIPE}::test_every_comparison_shares_its_baseline_run_and_every_name_is_one_command",),
        "the plain stability runs are trained again under another name: not the optimizer's runs",
    ),
    Mutant(
        "recipe-guard-counts-only-rollbacks",
        "machinery/recipe.py",
        'event in ("skipped_batch", "rollback")',
        'event == "rollback"',
        (f"{RECIPE}::test_guard_events_count_skips_and_rollbacks",),
        "the spike guard's skipped batches go uncounted beside a stability row",
    ),
    Mutant(
        "recipe-default-model-is-the-recipes",
        "machinery/recipe.py",
        'if job.model == "recipe":',
        "if True:",
        (f"{RECIPE}::test_every_comparison_shares_its_baseline_run_and_every_name_is_one_command",),
        "the 'default model' runs train the recipe's 2-layer model: Muon's win is not train.py's",
    ),
    Mutant(
        "recipe-grid-edge-unchecked",
        "machinery/recipe.py",
        'if f"{best[opt]:g}" in edges:',
        "if False:",
        (f"{RECIPE}::test_report_computes_each_effect_from_the_runs",),
        "a best rate at its grid's edge passes for a tuned one",
    ),
    Mutant(
        "sweep-wsd-branch-starts-a-step-late",
        "machinery/sweep.py",
        "return steps - int(round(settings.decay_fraction * steps))",
        "return steps - int(round(settings.decay_fraction * steps)) + 1",
        (
            "tests/test_sweep.py::"
            "test_wsd_gives_a_size_one_batch_and_makes_each_point_a_branch_of_its_trunk",
        ),
        "a WSD branch resumes one step after its schedule started decaying: that step ran at the peak",
    ),
    Mutant(
        "sweep-wsd-trunk-decays",
        "machinery/sweep.py",
        'cmd += ["--schedule", "wsd", "--decay-fraction", "0", "--keep-checkpoints", "1000"]',
        'cmd += ["--schedule", "wsd", "--decay-fraction", "0.2", "--keep-checkpoints", "1000"]',
        (
            "tests/test_sweep.py::"
            "test_a_wsd_branch_equals_one_straight_wsd_run_and_the_trunk_is_extended",
        ),
        "the trunk decays at the end of each segment, so a branch starts from an annealed model",
    ),
    Mutant(
        "book-cut-first-start-past-the-share",
        "book/build.py",
        "if before is not None and share - before[1] < done - share:",
        "if False:",
        ("tests/test_book.py::test_a_cut_falls_at_the_section_start_nearest_its_share",),
        "a page is cut at the first section start past its share: a few words more move a whole "
        "section to the next part (sweep.py's third part reached 50 minutes that way)",
    ),
]


# ------------------------------------------------------------------------------------------------------------------
# Applying a mutant and running its tests
# ------------------------------------------------------------------------------------------------------------------


class MutantError(Exception):
    """A mutant that cannot be applied: its pattern is gone from (or repeated in) the source."""


def check_patterns(mutants: list[Mutant], root: pathlib.Path = ROOT) -> None:
    """Raise MutantError naming every mutant whose pattern does not occur exactly once in its file."""
    problems = []
    for m in mutants:
        path = root / m.file
        count = path.read_text().count(m.old) if path.is_file() else -1
        if count != 1:
            where = (
                "file is missing" if count < 0 else f"pattern found {count} times, need exactly 1"
            )
            problems.append(
                f"mutant {m.name!r} in {m.file}: {where}; update MUTANTS in tests/mutation_check.py"
            )
        if m.old == m.new:
            problems.append(f"mutant {m.name!r} changes nothing")
    if problems:
        raise MutantError("\n".join(problems))


def copy_repository(dest: pathlib.Path) -> pathlib.Path:
    """The working tree without .git, caches and run outputs (about 1 MB)."""
    ignore = shutil.ignore_patterns(
        ".git",
        "__pycache__",
        ".pytest_cache",
        ".hypothesis",
        ".benchmarks",
        ".cache",
        "out",
        "out-*",
        "*.egg-info",
    )
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def shared_data() -> str:
    """Where the tests of the real repository find the corpora (see tests/conftest.py)."""
    return os.environ.get("SHARED_DATA", str(ROOT.parent / "shared" / "data"))


def run_tests(copy: pathlib.Path, tests: tuple, timeout_s: float) -> tuple[int | None, str]:
    """pytest's exit code on `tests` inside `copy` (None on timeout) and the last lines of its output."""
    env = {
        **os.environ,
        "SHARED_DATA": shared_data(),
        "OMP_NUM_THREADS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "-W",
        "ignore",
        *tests,
    ]
    try:
        done = subprocess.run(
            cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout_s:.0f} s"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return done.returncode, "\n".join(lines[-15:])


def verdict(returncode: int | None) -> str:
    """pytest exit code -> killed / SURVIVED / error (see the module docstring)."""
    return {1: "killed", 0: "SURVIVED"}.get(returncode, "error")


def run_mutant(m: Mutant | None, tests: tuple, timeout_s: float) -> dict:
    """Apply `m` (None: the baseline) to a fresh copy, run `tests` there; a result row for the table."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mutation-") as tmp:
        copy = copy_repository(pathlib.Path(tmp) / "repo")
        if m is not None:
            path = copy / m.file
            path.write_text(path.read_text().replace(m.old, m.new, 1))
        code, tail = run_tests(copy, tests, timeout_s)
    return {
        "name": m.name if m else "baseline",
        "file": m.file if m else "-",
        "code": code,
        "result": verdict(code),
        "seconds": time.monotonic() - start,
        "tail": tail,
    }


def run_all(
    mutants: list[Mutant], jobs: int, timeout_s: float, log=print, baseline=True
) -> list[dict]:
    """The baseline (every listed test, unmutated; unless `baseline` is False), then every mutant, `jobs` at a
    time."""
    check_patterns(mutants)
    every_test = tuple(dict.fromkeys(t for m in mutants for t in m.tests))
    if baseline:
        run = run_mutant(None, every_test, timeout_s * 2)
        log(
            f"baseline: {len(every_test)} test targets, pytest exit {run['code']} ({run['seconds']:.0f} s)"
        )
        if run["code"] != 0:
            raise MutantError(
                f"the tests fail without any mutant, so kills would mean nothing:\n{run['tail']}"
            )
    rows = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run_mutant, m, m.tests, timeout_s): m for m in mutants}
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            log(f"  {row['result']:<9} {row['name']} ({row['seconds']:.0f} s)")
            if row["result"] != "killed":
                log("    " + row["tail"].replace("\n", "\n    "))
            rows.append(row)
    order = {m.name: i for i, m in enumerate(mutants)}
    return sorted(rows, key=lambda r: order[r["name"]])


def kill_table(mutants: list[Mutant], rows: list[dict]) -> str:
    """A Markdown table: mutant, file, what it breaks, result; then the kill rate."""
    why = {m.name: m.why for m in mutants}
    lines = ["| mutant | file | the mistake | result |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['file']} | {why[r['name']]} | {r['result']} |" for r in rows]
    killed = sum(r["result"] == "killed" for r in rows)
    lines.append(f"\nkilled {killed} of {len(rows)} mutants")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument(
        "--only", default="", help="comma-separated mutant names to run (default: all)"
    )
    parser.add_argument(
        "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="mutants run at once"
    )
    parser.add_argument(
        "--timeout", type=float, default=300, help="seconds per mutant before it counts as an error"
    )
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the unmutated run: only where these tests just passed on this same tree (CI)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1 or not args.timeout > 0:
        parser.error("--jobs must be >= 1 and --timeout > 0")
    mutants = MUTANTS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = sorted(set(names) - {m.name for m in MUTANTS})
        if unknown:
            parser.error(f"--only: unknown mutant(s) {', '.join(unknown)}; see --list")
        mutants = [m for m in MUTANTS if m.name in names]
    if args.list:
        for m in mutants:
            print(f"{m.name:<34} {m.file:<12} {m.why}\n{'':<47}tests: {' '.join(m.tests)}")
        return 0
    try:
        rows = run_all(mutants, args.jobs, args.timeout, baseline=not args.no_baseline)
    except MutantError as e:
        print(f"mutation check: {e}", file=sys.stderr)
        return 2
    print(kill_table(mutants, rows))
    return 0 if all(r["result"] == "killed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
