"""Notebook 07's search (paper section 1: an embedding model is for retrieval; section 4.2 scores it on code search):
encode a folder into an index (`index.py`, of the folders `sources.py` names), then a small searcher (`searcher.py`)."""
