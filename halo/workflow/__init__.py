"""The GitHub workflow: ci/matrix.yaml (which nox sessions run where) rendered into .github/."""
