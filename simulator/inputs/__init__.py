"""The one layer every user-supplied file and value goes through.

Experiment, sweep and capacity YAML, ``--set`` values, Hugging Face ``config.json`` files,
hardware profiles and traces are read by :mod:`servesim.inputs.files` (one reader per format),
checked by pydantic models built on :class:`~servesim.inputs.schema.StrictModel`, and every
defect becomes one :class:`~servesim.errors.ServesimError` line naming the file, the field (or
line and column) and the fix, through one converter (:func:`~servesim.inputs.schema.user_error`).
"""

from servesim.inputs.files import read_json, read_text, read_yaml, yaml_mapping
from servesim.inputs.overrides import apply_overrides, parse_override
from servesim.inputs.schema import (
           FrozenModel,
           NamedSection,
           StrictModel,
           allowed_keys,
           parse_model,
           user_error,
)

__all__ = ["FrozenModel", "NamedSection", "StrictModel", "allowed_keys", "apply_overrides", "parse_model",
           "parse_override", "read_json", "read_text", "read_yaml", "user_error", "yaml_mapping"]
