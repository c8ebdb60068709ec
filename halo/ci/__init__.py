"""CI: ci/matrix.yaml (which nox sessions run where) rendered into the GitHub workflow."""
