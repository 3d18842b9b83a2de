"""The records of a trace file, one JSON object a line: the one schema its writer and its reader share.

The writer is the trace hooks inside vLLM's worker (`deploykit.vllm_plugin.trace_hooks`), the reader is
`deploykit.trace.report`; the fixes read it too, to say which module their patch targets
(`Fix.trace_suggestion`). Pure pydantic, on the ground floor: every side may import it. Reading ignores
keys it does not know, so a trace written by another deploykit version still reads.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

# The largest finite value of each floating dtype the hooks report (torch.finfo(dtype).max).
DTYPE_MAX: dict[str, float] = {
    "float16": 65504.0,
    "bfloat16": 3.3895313892515355e38,
    "float32": 3.4028234663852886e38,
    "float64": 1.7976931348623157e308,
}
HALF_DTYPES = ("float16", "bfloat16")


class _Record(BaseModel):
    # Every float in a record is finite by construction (absmax of the finite part, statistics of the
    # finite values): a NaN or Inf is a writer bug, refused when the record is made, never written.
    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)

    rank: int = Field(default=0, description="the writing worker's tensor parallel rank")

    def to_json_line(self) -> str:
        """One line of the trace file (compact JSON, keys as the reader names them)."""
        return self.model_dump_json(by_alias=True)


class HeaderLine(_Record):
    """Once per worker, after the model is hooked: what is traced."""

    kind: Literal["header"] = "header"
    pid: int = 0
    vllm: str = "unknown"
    model_class: str = ""
    architectures: list[str] = Field(default_factory=list)
    modules_hooked: int = 0
    dtype: str | None = None
    fixes: list[str] = Field(default_factory=list)
    tp_size: int = 1


class StepLine(_Record):
    """One engine step that carried real requests (never a dummy or profile run)."""

    kind: Literal["step"] = "step"
    step: int
    requests: list[str]
    num_tokens: int = 0


class ModuleLine(_Record):
    """One module's forward call in a step, written when it returns (children before their parent)."""

    kind: Literal["module"] = "module"
    step: int
    order: int
    module: str
    class_name: str = Field(alias="class")
    dtype: str | None = None
    shape: list[int] = Field(default_factory=list)
    inputs_finite: bool = True
    input_absmax: float | None = None
    output_finite: bool = True
    nonfinite: int = 0
    nan: int = 0
    inf: int = 0
    numel: int = 0
    first_bad: list[int] | None = None
    output_absmax: float | None = Field(default=None, description="absmax of the finite part of the output")
    output_index: int | None = Field(default=None, description="which output tensor held the first bad value")

    @property
    def bad_token(self) -> int | None:
        """The first bad value's token (row of the batch): its first index, when it has two or more."""
        return self.first_bad[0] if self.first_bad is not None and len(self.first_bad) >= 2 else None

    @property
    def bad_channel(self) -> int | None:
        """The first bad value's channel (hidden unit): its last index."""
        return self.first_bad[-1] if self.first_bad else None

    @property
    def dtype_max(self) -> float | None:
        return DTYPE_MAX.get(self.dtype or "")

    @property
    def fraction_of_dtype_max(self) -> float | None:
        """FP16/BF16 only: how close the finite part came to the dtype's largest value."""
        peak, limit = self.output_absmax, self.dtype_max
        if self.dtype not in HALF_DTYPES or not limit or peak is None:
            return None
        return peak / limit


class LogitsLine(_Record):
    """The logits of one step (`compute_logits`)."""

    kind: Literal["logits"] = "logits"
    step: int
    rows: int
    vocab: int
    nonfinite: int = 0
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    constant_rows: int = 0
    argmax: list[int] = Field(default_factory=list)


TraceRecord = HeaderLine | StepLine | ModuleLine | LogitsLine
_RECORD: TypeAdapter[TraceRecord] = TypeAdapter(Annotated[TraceRecord, Field(discriminator="kind")])


def parse_record(text: str) -> TraceRecord:
    """One line of a trace file; raises ValueError (bad JSON, or not a record) when it is not one."""
    data: Any = json.loads(text)
    return _RECORD.validate_python(data)
