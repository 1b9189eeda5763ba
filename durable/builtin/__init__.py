"""Operations that ship with the engine, and the helpers they share.

Each operation module registers its operations when imported;
``DurableConfig.ready`` imports them (``backup``, ``dbcopy``, ``files``,
``integrity``, ``noop``, ``restore``, ``retention``). This package imports
nothing itself, so the models layer can use its pure helpers (``derived``)
without loading any operation.
"""
