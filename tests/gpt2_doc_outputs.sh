#!/usr/bin/env bash
# docs/gpt2.md's quoted outputs, checked against the programs as README.md's are
# (tests/readme_outputs.sh). Run by make test.
exec env README=docs/gpt2.md bash "$(dirname "$0")/readme_outputs.sh"
