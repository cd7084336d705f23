"""Neutral `Constraint`s -> vLLM's `StructuredOutputsParams`, and the engine's check that
its structured-output backend can compile one (`EngineInfo.check_constraint`): the
constraint as the engine enforces it (`app.engine.vllm.json_grammar.lowered`: a JSON
schema on xgrammar is its corrected grammar), checked and run alike.

vLLM side of the seam (imports vLLM). The check is vLLM's own request validation
(`SamplingParams.verify`, which picks the backend as `--structured-outputs-config`
says and compiles the schema, regex or grammar there), run before the request is
submitted, so a constraint vLLM would refuse is a 400 naming the client's field rather
than an error inside a started stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.engine.async_llm import AsyncLLM

from app.engine.constraints import Constraint
from app.engine.vllm.json_grammar import lowered
from app.errors import InvalidRequest


def structured_outputs(constraint: Constraint | None) -> StructuredOutputsParams | None:
    if constraint is None:
        return None
    spec = constraint.spec
    kwargs: dict[str, Any]
    if constraint.kind == "json_object":
        kwargs = {"json_object": True}
    elif constraint.kind == "choice":
        kwargs = {"choice": list(spec or ())}
    else:
        kwargs = {constraint.kind: spec}
    # Whitespace and additional-properties policy are server-wide in vLLM 0.32
    # (`--structured-outputs-config`), not per request.
    return StructuredOutputsParams(**kwargs)


def constraint_checker(llm: AsyncLLM) -> Callable[[Constraint], None]:
    """`EngineInfo.check_constraint` for this engine."""
    config = llm.vllm_config
    processor = llm.input_processor

    def check(constraint: Constraint) -> None:
        enforced = lowered(constraint, config.structured_outputs_config)
        try:
            params = SamplingParams(structured_outputs=structured_outputs(enforced))
            params.verify(
                llm.model_config,
                config.speculative_config,
                config.structured_outputs_config,
                processor.tokenizer,
            )
        # vLLM's backends report a schema, regex or grammar they cannot compile with
        # ValueError (VLLMValidationError is one) or, for some inputs, TypeError.
        except (VLLMValidationError, ValueError, TypeError, RuntimeError) as exc:
            raise InvalidRequest(
                f"{constraint.param} cannot be enforced: {exc}", param=constraint.param
            ) from exc

    return check
