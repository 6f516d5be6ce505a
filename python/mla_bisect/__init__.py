"""mla_bisect: the Python side of mla-bisect. Writes and reads mla-bisect dumps (mla_bisect.dump) so that captures of
other systems (HF transformers, serving engines) are compared, inspected and replayed by the C++ tool."""
__version__ = "0.1.0"

from .dump import DumpError, DumpWriter, read_dump  # noqa: E402  (dump_write reads __version__)

__all__ = ["DumpError", "DumpWriter", "read_dump", "__version__"]
