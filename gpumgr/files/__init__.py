"""Small file helpers used across gpumgr.

- write.py: writing a file whole (every byte, fsync when asked), the first step of every temp-file-then-rename.
- docfile.py: reading bounded YAML or JSON input files with line numbers, so errors name the file and line.
"""
