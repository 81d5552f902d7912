"""The entry script MindSpore's compile cache hashes while a compile plan runs (``storage.graph_cache``).

MindSpore hashes ``sys.argv[0]`` and the files it imports outside the installed packages, at every compile with the
cache on, and raises where it cannot read them (``python -c``: no file; ``python -m mindspore_eagle.app.cli``: an
ImportError on the relative imports). That hash is not what keeps the cache right -- the cache directory's key is
(this package's code, the kernels, the model, the settings, the plan) -- so the plan points MindSpore at this file,
which imports nothing and never changes, whatever started the process.
"""
