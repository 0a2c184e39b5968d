"""minisgl: a small, readable LLM serving engine, built lesson by lesson.

The offline entry point is :class:`minisgl.LLM` with :class:`minisgl.SamplingParams`.
"""

__lesson__ = 'assembly'

from minisgl.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "LLM":  # imported lazily: `import minisgl` stays cheap
        from minisgl.llm import LLM

        return LLM
    raise AttributeError(name)
