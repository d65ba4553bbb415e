"""Notebook 07's search (docs/search.md): encode a folder into an index (`index`, of the folders `sources` names), then
a small searcher (`searcher`)."""
