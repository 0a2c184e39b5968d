"""Lesson 9: tensor parallelism. The rank's process group and its collectives (``tp``), and
the processes that run one rank each (``launcher``)."""

__lesson__ = 9

from minisgl.distributed.tp import TPGroup, get_tp, set_tp

__all__ = ["TPGroup", "get_tp", "set_tp"]
