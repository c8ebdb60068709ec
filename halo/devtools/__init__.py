"""Commands for people at a checkout: run a command in an image, check the docs, clean up."""
