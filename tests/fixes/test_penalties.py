"""device_penalties: the processor against vLLM's own penalty function, driven by vLLM's own InputBatch.

The batch updates come from a real `vllm.v1.worker.gpu_input_batch.InputBatch` (add, remove, condense,
swap), so adds, removes, one-way moves and swaps arrive exactly as the V1 model runner sends them. The
reference is `vllm.v1.sample.ops.penalties.apply_all_penalties` fed from the same InputBatch's state.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")
# vLLM 0.34 deleted the V1 runner this fix patches: its "target missing" path is
# tests/vllm_releases/test_release_checks.py's (test_every_fix_target_is_as_the_release_has_it).
pytest.importorskip("vllm.v1.sample.logits_processor", reason="this vLLM has no V1 model runner (0.34+)")

from vllm import SamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import LogitsProcessors  # noqa: E402
from vllm.v1.sample.ops.penalties import apply_all_penalties  # noqa: E402
from vllm.v1.sample.sampler import Sampler  # noqa: E402
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch  # noqa: E402

from deploykit.fixes import _penalties_processor as impl  # noqa: E402
from deploykit.fixes import penalties  # noqa: E402
from deploykit.fixes.base import FixError, TargetStatus  # noqa: E402
from deploykit.installed import vllm_version_label  # noqa: E402

CPU = torch.device("cpu")


def fake_vllm_config(max_rows: int, vocab: int, max_model_len: int) -> Any:
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(max_num_seqs=max_rows),
        model_config=SimpleNamespace(get_vocab_size=lambda: vocab, max_model_len=max_model_len),
    )


def make_batch(max_rows: int, vocab: int, max_model_len: int, *, with_processor: bool = True) -> InputBatch:
    procs = [impl.DevicePenaltiesProcessor(fake_vllm_config(max_rows, vocab, max_model_len), CPU, False)]
    return InputBatch(
        max_num_reqs=max_rows,
        max_model_len=max_model_len,
        max_num_batched_tokens=8192,
        device=CPU,
        vocab_size=vocab,
        block_sizes=[16],
        max_num_blocks_per_req=[max_model_len // 16],
        logitsprocs=LogitsProcessors(procs if with_processor else []),
        logitsprocs_need_output_token_ids=with_processor,
    )


def the_processor(batch: InputBatch) -> impl.DevicePenaltiesProcessor:
    (proc,) = [p for p in batch.logitsprocs.all if isinstance(p, impl.DevicePenaltiesProcessor)]
    return proc


def vllm_reference(batch: InputBatch, logits: torch.Tensor) -> torch.Tensor:
    """vLLM's own host penalty path on the batch's own state (prompt tensor, penalties, output lists)."""
    n = batch.num_reqs
    return apply_all_penalties(
        logits.clone(),
        batch._make_prompt_token_ids_cpu_tensor(),
        batch.presence_penalties_cpu_tensor[:n],
        batch.frequency_penalties_cpu_tensor[:n],
        batch.repetition_penalties_cpu_tensor[:n],
        [list(ids) for ids in batch.req_output_token_ids[:n]],
    )


@pytest.fixture
def stand_aside() -> Iterator[None]:
    impl.install_stand_aside()
    yield
    impl.remove_stand_aside()


class Driver:
    """Random request traffic through a real InputBatch, mutating output lists the way vLLM does."""

    def __init__(
        self,
        batch: InputBatch,
        vocab: int,
        seed: int,
        plain_fraction: float = 0.2,
        empty_prompt_fraction: float = 0.0,
    ) -> None:
        self.batch = batch
        self.plain_fraction = plain_fraction
        self.empty_prompt_fraction = empty_prompt_fraction
        self.empty_prompts = 0
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.next_id = 0
        # req_id -> positions of -1 placeholders still to be filled, like async scheduling leaves them
        self.placeholders: dict[str, list[int]] = {}
        self.stats = {
            "adds": 0,
            "removes": 0,
            "swaps": 0,
            "resumed": 0,
            "placeholders": 0,
            "bursts": 0,
            "trims": 0,
        }

    def params(self) -> SamplingParams:
        rng = self.rng
        if rng.random() < self.plain_fraction:
            return SamplingParams(temperature=0.0)  # no penalties: the row must stay untouched
        return SamplingParams(
            temperature=rng.choice([0.0, 0.8]),
            repetition_penalty=rng.choice([1.0, 1.1, 1.7, 0.6]),
            frequency_penalty=rng.choice([0.0, 0.3, -0.5, 1.9]),
            presence_penalty=rng.choice([0.0, 0.4, -1.2]),
        )

    def token(self) -> int:
        # A skewed distribution so tokens repeat (counts > 1) while many stay distinct.
        if self.rng.random() < 0.5:
            return self.rng.randrange(min(40, self.vocab))
        return self.rng.randrange(self.vocab)

    def add(self) -> None:
        rng = self.rng
        prompt = [self.token() for _ in range(rng.randrange(1, 60))]
        if rng.random() < self.empty_prompt_fraction:  # a row that starts with no token at all
            prompt = []
            self.empty_prompts += 1
        outputs: list[int] = []
        if rng.random() < 0.15:  # a resumed (preempted) request arrives with outputs already
            outputs = [self.token() for _ in range(rng.randrange(1, 800))]
            self.stats["resumed"] += 1
        req_id = f"req-{self.next_id}"
        self.next_id += 1
        request = CachedRequestState(
            req_id=req_id,
            prompt_token_ids=prompt,
            mm_features=[],
            sampling_params=self.params(),
            generator=None,
            block_ids=([],),
            num_computed_tokens=0,
            output_token_ids=outputs,
        )
        self.batch.add_request(request)
        self.placeholders[req_id] = []
        self.stats["adds"] += 1

    def reshape_batch(self) -> None:
        rng, batch = self.rng, self.batch
        for req_id in list(batch.req_ids):
            if rng.random() < 0.08:
                batch.remove_request(req_id)
                self.placeholders.pop(req_id, None)
                self.stats["removes"] += 1
        while (
            batch.num_reqs + len(batch.batch_update_builder.removed) < batch.max_num_reqs
            and rng.random() < 0.4
        ):
            self.add()
        batch.condense()
        if batch.num_reqs >= 2 and rng.random() < 0.3:
            i1, i2 = rng.sample(range(batch.num_reqs), 2)
            batch.swap_states(i1, i2)
            self.stats["swaps"] += 1
        batch.refresh_metadata()

    def grow_outputs(self) -> None:
        """One decode step's worth of output changes, applied in place to vLLM's running lists."""
        rng = self.rng
        for index, req_id in enumerate(self.batch.req_ids):
            outputs = self.batch.req_output_token_ids[index]
            assert outputs is not None
            pending = self.placeholders[req_id]
            if pending and rng.random() < 0.6:  # the async copy landed: fill the placeholders
                if pending[-1] == len(outputs) - 1 and rng.random() < 0.3:
                    # Fewer sampled ids than trailing placeholders: vLLM trims the tail
                    # (gpu_input_batch.update_async_output_token_ids).
                    del outputs[pending.pop()]
                    self.stats["trims"] += 1
                for pos in pending:
                    outputs[pos] = self.token()
                pending.clear()
            roll = rng.random()
            if roll < 0.15:
                pending.append(len(outputs))
                outputs.append(-1)
                self.stats["placeholders"] += 1
            elif roll < 0.2:
                outputs.extend(self.token() for _ in range(rng.randrange(2, 9)))
                self.stats["bursts"] += 1
            else:
                outputs.append(self.token())


def full_batch(
    max_rows: int, vocab: int, seed: int
) -> tuple[InputBatch, impl.DevicePenaltiesProcessor, Driver]:
    """A batch filled to `max_rows` penalised requests, its processor and the driver that grows it."""
    batch = make_batch(max_rows, vocab, max_model_len=4096)
    proc = the_processor(batch)
    driver = Driver(batch, vocab, seed=seed)
    for _ in range(max_rows):
        driver.add()
    batch.refresh_metadata()
    return batch, proc, driver


@pytest.mark.parametrize(
    ("seed", "plain_fraction"),
    [(0, 0.2), (1, 0.2), (2, 0.2), (3, 0.0)],  # 0.0: every row penalised, the sliced (no-gather) path
)
def test_randomized_batches_match_vllm_exactly(stand_aside: None, seed: int, plain_fraction: float) -> None:
    vocab, max_rows, max_model_len = 1500, 24, 2048
    batch = make_batch(max_rows, vocab, max_model_len)
    proc = the_processor(batch)
    driver = Driver(batch, vocab, seed, plain_fraction)
    prefix_steps = 0
    gen = torch.Generator().manual_seed(seed)
    compared = 0
    widest = 0
    for step in range(160):
        driver.reshape_batch()
        driver.grow_outputs()
        n = batch.num_reqs
        if n == 0:
            continue
        logits = torch.randn(n, vocab, generator=gen, dtype=torch.float32) * 4
        logits[:, ::7] = 0.0  # the repetition rule branches on > 0; zeros must follow vLLM
        expected = vllm_reference(batch, logits)
        got = proc.apply(logits.clone())
        assert torch.equal(got, expected), f"seed {seed} step {step}: max diff {(got - expected).abs().max()}"
        assert not torch.equal(expected, logits) or not proc.rows
        compared += 1
        widest = max(widest, proc.width)
        prefix_steps += proc._active_prefix
    # The traffic exercised every kind of change, and the table had to grow past its first width.
    assert compared > 150
    assert all(count > 0 for count in driver.stats.values()), driver.stats
    assert widest > impl.INITIAL_WIDTH
    if plain_fraction == 0.0:
        assert prefix_steps > compared // 2


def test_small_chunks_empty_rows_and_strided_logits_match_vllm_exactly(
    stand_aside: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of one or two rows (each chunk's scatter must not disturb the next chunk's rows), rows that
    start empty (their first token rebuilds them) and strided logits (a view of a wider tensor)."""
    monkeypatch.setattr(impl, "CPU_CHUNK_SLOTS", 150)
    vocab, max_rows, max_model_len = 1500, 16, 2048
    batch = make_batch(max_rows, vocab, max_model_len)
    proc = the_processor(batch)
    driver = Driver(batch, vocab, seed=5, plain_fraction=0.1, empty_prompt_fraction=0.3)
    gen = torch.Generator().manual_seed(5)
    strided_steps = chunked_steps = 0
    for step in range(120):
        driver.reshape_batch()
        driver.grow_outputs()
        n = batch.num_reqs
        if n == 0:
            continue
        wide = torch.randn(n, vocab + 9, generator=gen, dtype=torch.float32) * 4
        wide[:, ::5] = 0.0
        logits = wide[:, :vocab] if step % 2 else wide[:, :vocab].contiguous()
        expected = vllm_reference(batch, logits.clone())
        got = proc.apply(logits)
        assert torch.equal(got, expected), f"step {step}: max diff {(got - expected).abs().max()}"
        strided_steps += not logits.is_contiguous()
        chunked_steps += proc._live_width > impl.CPU_CHUNK_SLOTS // 2  # chunks of one row
    assert driver.empty_prompts > 5
    assert strided_steps > 50
    assert chunked_steps > 50


def test_row_without_tokens_leaves_logits_alone_until_its_first_token(stand_aside: None) -> None:
    """A penalised row with an empty prompt whose first outputs are still placeholders has nothing to
    penalise: its logits stay as they are (its dead slots point at some column all the same)."""
    vocab = 300
    batch = make_batch(4, vocab, max_model_len=512)
    proc = the_processor(batch)
    penalised = SamplingParams(
        temperature=0.0, repetition_penalty=1.7, frequency_penalty=0.3, presence_penalty=0.4
    )
    for req_id, prompt, params in (
        ("empty", [], penalised),
        ("full", [0, 5, 7, 7], penalised),
        ("plain", [], SamplingParams(temperature=0.0)),
    ):
        batch.add_request(
            CachedRequestState(
                req_id=req_id,
                prompt_token_ids=prompt,
                mm_features=[],
                sampling_params=params,
                generator=None,
                block_ids=([],),
                num_computed_tokens=0,
                output_token_ids=[],
            )
        )
    batch.refresh_metadata()
    empty_outputs, full_outputs = batch.req_output_token_ids[0], batch.req_output_token_ids[1]
    assert empty_outputs is not None and full_outputs is not None
    gen = torch.Generator().manual_seed(0)
    for step in range(8):
        if step < 4:
            empty_outputs.append(-1)  # async scheduling: the token is not known yet
        else:
            empty_outputs[step - 4] = [0, 9, 0, 5][step - 4]  # filled in place, then more tokens
            empty_outputs.append(-1)
        full_outputs.append(step % 3)
        logits = torch.randn(3, vocab, generator=gen) * 4
        expected = vllm_reference(batch, logits)
        got = proc.apply(logits.clone())
        assert torch.equal(got, expected), f"step {step}"
        if step < 4:
            assert torch.equal(got[0], logits[0]), f"step {step}"
    assert proc.rows[0].bound > 0


def cuda_kernel_repetition_rule(
    logits: torch.Tensor, prompt_mask: torch.Tensor, output_mask: torch.Tensor, penalties: torch.Tensor
) -> None:
    """What vLLM's CUDA kernel (`torch.ops._C.apply_repetition_penalties_`) does, on any device: a repeated
    token's positive logit is divided by the penalty, any other repeated logit multiplied by it."""
    penalty = penalties.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    logits.copy_(torch.where(prompt_mask | output_mask, penalised, logits))


def test_dividing_rule_matches_vllm_cuda_kernel(stand_aside: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA the processor divides like vLLM's kernel instead of multiplying by the reciprocal; the
    arithmetic is checked here on CPU tensors (the processor's CUDA path differs only in chunking)."""
    from vllm import _custom_ops

    vocab, max_rows = 1500, 24
    batch = make_batch(max_rows, vocab, max_model_len=2048)
    proc = the_processor(batch)
    driver = Driver(batch, vocab, seed=9)
    gen = torch.Generator().manual_seed(9)
    differs_from_reciprocal = 0
    for step in range(80):
        driver.reshape_batch()
        driver.grow_outputs()
        n = batch.num_reqs
        if n == 0 or not proc.rows:
            continue
        logits = torch.randn(n, vocab, generator=gen, dtype=torch.float32) * 4
        with monkeypatch.context() as patch:
            patch.setattr(_custom_ops, "apply_repetition_penalties", cuda_kernel_repetition_rule)
            expected = vllm_reference(batch, logits)
        got = logits.clone()
        if proc._active_dirty:
            proc._refresh_active()
        proc._take_new_tokens()
        proc._penalise(got, divide=True)
        assert torch.equal(got, expected), f"step {step}: max diff {(got - expected).abs().max()}"
        differs_from_reciprocal += not torch.equal(expected, vllm_reference(batch, logits))
    assert differs_from_reciprocal > 20  # the two rules really differ in the last bit now and then


def test_logits_wider_than_the_vocab(stand_aside: None) -> None:
    """Logits with more columns than the model's vocab (a padded head): the tokens' columns are found by
    the logits' own row length and the extra columns stay untouched."""
    vocab, max_rows = 1500, 16
    batch = make_batch(max_rows, vocab, max_model_len=2048)
    proc = the_processor(batch)
    driver = Driver(batch, vocab, seed=13)
    gen = torch.Generator().manual_seed(13)
    for step in range(60):
        driver.reshape_batch()
        driver.grow_outputs()
        n = batch.num_reqs
        if n == 0:
            continue
        wide = torch.randn(n, vocab + 11, generator=gen, dtype=torch.float32) * 4
        expected = vllm_reference(batch, wide[:, :vocab])
        got = proc.apply(wide.clone())
        assert torch.equal(got[:, :vocab], expected), f"step {step}"
        assert torch.equal(got[:, vocab:], wide[:, vocab:]), f"step {step}"


def test_overflowing_table_keeps_what_fits_and_touches_nothing_else(stand_aside: None) -> None:
    """More distinct tokens than min(vocab, max_model_len) cannot happen in vLLM; should it happen, the
    tokens that do not fit are dropped and no other logit changes (nothing lands out of bounds)."""
    from vllm.v1.sample.logits_processor import BatchUpdate

    vocab = 50
    proc = impl.DevicePenaltiesProcessor(fake_vllm_config(2, vocab, max_model_len=4), CPU, False)
    params = SamplingParams(repetition_penalty=1.5, frequency_penalty=0.5, presence_penalty=0.25)
    outputs: list[int] = []
    proc.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, params, [1, 2], outputs)], moved=[]))
    gen = torch.Generator().manual_seed(0)
    others = [column for column in range(vocab) if column not in (1, 2, 3, 4)]
    for token in (3, 4, 5, 6, 4):
        outputs.append(token)
        logits = torch.randn(1, vocab, generator=gen) * 4
        got = proc.apply(logits.clone())
        assert torch.equal(got[:, others], logits[:, others]), f"after token {token}"
    kept = [token for token in outputs if token in (3, 4)]
    expected = apply_all_penalties(
        logits.clone(),
        torch.tensor([[1, 2]]),
        torch.tensor([params.presence_penalty]),
        torch.tensor([params.frequency_penalty]),
        torch.tensor([params.repetition_penalty]),
        [kept],
    )
    assert proc.width == 4
    assert torch.equal(got, expected)


def test_state_scales_with_distinct_tokens_not_vocab(stand_aside: None) -> None:
    vocab, max_rows = 128_256, 8
    batch, proc, driver = full_batch(max_rows, vocab, seed=7)
    for _ in range(300):
        driver.grow_outputs()
        proc.apply(torch.zeros(batch.num_reqs, vocab))
    longest = max(len(ids or []) for ids in batch.req_output_token_ids) + 60
    assert proc.width <= max(impl.INITIAL_WIDTH, int(longest * impl.WIDTH_GROWTH) + impl.WIDTH_ROUND)
    dense_v2_bytes = max_rows * vocab * 4  # vLLM V2 runner: int32 [rows, vocab] output counts
    assert proc.state_bytes() * 20 < dense_v2_bytes, (proc.state_bytes(), dense_v2_bytes)
    # When the last penalised request leaves, the tables shrink back.
    for req_id in list(batch.req_ids):
        batch.remove_request(req_id)
    batch.condense()
    batch.refresh_metadata()
    assert proc.width == impl.INITIAL_WIDTH


def test_per_step_host_hands_over_only_the_newest_tokens(stand_aside: None) -> None:
    vocab, max_rows = 5000, 16
    batch, proc, driver = full_batch(max_rows, vocab, seed=3)
    proc.apply(torch.zeros(batch.num_reqs, vocab))
    uploads: list[int] = []
    real_upload = proc._int_ring.upload

    def counting_upload(data: Any, dest: Any) -> Any:
        uploads.append(int(data.shape[0]))
        return real_upload(data, dest)

    proc._int_ring.upload = counting_upload  # type: ignore[method-assign]
    for step in range(200):
        for outputs in batch.req_output_token_ids[: batch.num_reqs]:
            assert outputs is not None
            outputs.append(driver.token())
        proc.apply(torch.zeros(batch.num_reqs, vocab))
        # One (row, token) pair per penalised row, whatever the output length (here up to 600+).
        assert uploads[-1] == 2 * len(proc.rows), step
    assert len(uploads) == 200


def test_no_pass_over_batch_by_vocab(stand_aside: None) -> None:
    """Every tensor the processor makes per step is [rows, table width] or smaller, never [rows, vocab]."""
    from torch.utils._python_dispatch import TorchDispatchMode

    vocab, max_rows = 128_256, 8
    batch, proc, driver = full_batch(max_rows, vocab, seed=5)
    logits = torch.randn(batch.num_reqs, vocab)
    for _ in range(50):
        driver.grow_outputs()
        proc.apply(logits)

    largest: list[tuple[int, str]] = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(tensor, torch.Tensor) and tensor.data_ptr() != logits.data_ptr():
                    largest.append((tensor.numel(), str(func)))
            return out

    driver.grow_outputs()
    with Record():
        proc.apply(logits)
    biggest = max(largest)
    assert biggest[0] <= max_rows * (proc.width + 1), biggest
    assert biggest[0] * 50 < logits.numel(), biggest


def test_host_path_applies_penalties_twice_without_the_stand_aside() -> None:
    """The stand-aside is what makes penalties happen once: vLLM's real Sampler, without and with it."""
    vocab = 700
    batch = make_batch(8, vocab, max_model_len=1024)
    driver = Driver(batch, vocab, seed=11)
    for _ in range(6):
        driver.add()
    batch.refresh_metadata()
    for _ in range(30):
        driver.grow_outputs()
    logits = torch.randn(batch.num_reqs, vocab)
    expected = vllm_reference(batch, logits)
    assert not torch.equal(expected, logits)

    impl.remove_stand_aside()  # building the processor installed it; take it away to see the failure
    batch.sampling_metadata = batch._make_sampling_metadata()
    assert batch.sampling_metadata.no_penalties is False
    twice = Sampler().apply_logits_processors(logits.clone(), batch.sampling_metadata, False)
    assert not torch.equal(twice, expected)  # our processor, then vLLM's host path again

    try:
        impl.install_stand_aside()
        batch.sampling_metadata = batch._make_sampling_metadata()
        assert batch.sampling_metadata.no_penalties is True
        assert batch.sampling_metadata.prompt_token_ids is None  # nor is the host prompt tensor built
        once = Sampler().apply_logits_processors(logits.clone(), batch.sampling_metadata, False)
        assert torch.equal(once, expected)
    finally:
        impl.remove_stand_aside()


def test_fix_on_without_processor_keeps_vllm_host_path(stand_aside: None) -> None:
    batch = make_batch(4, 300, max_model_len=512, with_processor=False)
    request = CachedRequestState(
        req_id="only",
        prompt_token_ids=[1, 2, 3],
        mm_features=[],
        sampling_params=SamplingParams(temperature=0.0, frequency_penalty=0.5),
        generator=None,
        block_ids=([],),
        num_computed_tokens=0,
        output_token_ids=[],
    )
    batch.add_request(request)
    batch.refresh_metadata()
    assert batch.no_penalties is False
    assert batch.sampling_metadata.no_penalties is False


def test_check_target_applicable_on_installed_vllm() -> None:
    check = penalties.check_target()
    assert check.status is TargetStatus.APPLICABLE, check


def test_apply_is_idempotent_and_names_the_target() -> None:
    try:
        first = penalties.apply()
        second = penalties.apply()
        assert first == second == "vllm.v1.worker.gpu_input_batch.InputBatch.no_penalties"
        assert isinstance(InputBatch.__dict__["no_penalties"], property)
        assert InputBatch.__dict__["no_penalties"].__doc__.startswith("deploykit")
    finally:
        impl.remove_stand_aside()


def test_fixed_upstream_leaves_vllm_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.sample.ops import penalties as penalties_ops

    def device_side(logits: Any, prompt_token_ids: Any, output_token_ids: torch.Tensor) -> Any:
        return logits

    monkeypatch.setattr(penalties_ops, "apply_all_penalties", device_side)
    before = InputBatch.__dict__["no_penalties"]
    check = penalties.check_target()
    assert check.status is TargetStatus.FIXED_UPSTREAM
    assert "fixed upstream" in penalties.apply()
    assert InputBatch.__dict__["no_penalties"] is before
    proc = impl.DevicePenaltiesProcessor(fake_vllm_config(4, 100, 128), CPU, False)
    assert proc.engaged is False
    logits = torch.randn(2, 100)
    assert torch.equal(proc.apply(logits.clone()), logits)


def test_target_missing_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(InputBatch, "no_penalties")
    check = penalties.check_target()
    assert check.status is TargetStatus.TARGET_MISSING
    with pytest.raises(FixError, match=rf"device_penalties.*vLLM {re.escape(vllm_version_label())}"):
        penalties.apply()
    with pytest.raises(FixError, match="device_penalties"):
        impl.DevicePenaltiesProcessor(fake_vllm_config(4, 100, 128), CPU, False)


def test_processor_interface_shape_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.sample.logits_processor import BatchUpdate

    monkeypatch.setattr(BatchUpdate, "__dataclass_fields__", {"batch_size": None})
    check = penalties.check_target()
    assert check.status is TargetStatus.TARGET_MISSING
    assert "BatchUpdate" in check.detail


def test_module_import_stays_free_of_torch_and_vllm() -> None:
    code = (
        "import sys, deploykit.fixes.penalties as p; "
        "assert 'torch' not in sys.modules and 'vllm' not in sys.modules, 'heavy import'; "
        "print(p.PROCESSOR)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "deploykit.fixes.penalties:DevicePenaltiesProcessor"


def test_processor_resolves_through_the_fix_module() -> None:
    assert penalties.DevicePenaltiesProcessor is impl.DevicePenaltiesProcessor
    with pytest.raises(AttributeError):
        _ = penalties.NoSuchThing
