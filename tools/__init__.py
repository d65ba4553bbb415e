"""What no notebook calls, beside the library: the preflight (`python -m tools.preflight`), the paper-scale formulas
(`scale.py`), the offline snapshot's builder (`build_snapshot.py`), the multi-machine launcher (`python -m
tools.launch`), the encode demo (`python -m tools.demo`), and the GPU check and its wheels (`gpu_check.py`,
`gpu_wheels.py`, run as scripts). These import c2llm_lib; the library never imports them (tests/test_layers.py).
Run from the repository's root (or with it on PYTHONPATH): tools/ is not installed with the package.
"""
