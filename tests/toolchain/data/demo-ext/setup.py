import os

from setuptools import Extension, setup

# The greeting is a build knob: it enters the derivation hash through the build env.
greeting = os.environ.get("DEMO_GREETING", "hello")
setup(
    ext_modules=[
        Extension("halo_demo_ext", ["demo.c"], define_macros=[("DEMO_GREETING", f'"{greeting}"')]),
    ]
)
