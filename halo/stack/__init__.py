"""GPU stacks proven without a GPU: install a lock exactly as its image does, then check it.

`install_step` is the one install step of the images and of `halo stack verify` (it runs
inside the image build too, so it imports only the standard library and halo's patch engine).
"""
