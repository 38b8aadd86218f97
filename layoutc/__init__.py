"""layoutc: MoE weight layouts as declarative specs, verified index maps and generated converters."""

__version__ = "0.1.0"

from .api import CompiledSpec, compile_file, compile_source  # noqa: E402
from .errors import Diagnostic, SpecError  # noqa: E402
from .lower.runtime import LayoutError  # noqa: E402

__all__ = ["CompiledSpec", "LayoutError", "Diagnostic", "SpecError", "compile_file", "compile_source", "__version__"]
