"""DeepEP asks git for its version while building.

Defect (DeepEP 2.1.0, commit dd758ca, ``setup.py``): ``get_package_version()`` runs
``git status --porcelain`` and ``git rev-parse --short HEAD`` and appends the revision, or
``+local`` when git fails, to the release version.

Symptom: built from a pinned source archive (no checkout), the wheel is ``deep_ep
2.1.0+local``, which is not the pinned 2.1.0; on a host without git the build depends on how
the subprocess fails; in a checkout it would depend on the working tree's state.

Fix: the version is the release's own (``deep_ep/__init__.py``); the commit is already
pinned in pins/sources.toml and recorded in the derivation.

Upstream: none yet; when DeepEP stops calling git here the defect is gone and the patch
reports drift, to be removed then.
"""

from halo.patching import Edit, Patch

FILE = "setup.py"

DEFECT = """    # noinspection PyBroadException
    try:
        status_cmd = ['git', 'status', '--porcelain']
        status_output = subprocess.check_output(status_cmd).decode('ascii').strip()
        if status_output:
            print(f'Warning: Git working directory is not clean. Uncommitted changes:\\n{status_output}')
            assert False, 'Git working directory is not clean'

        cmd = ['git', 'rev-parse', '--short', 'HEAD']
        revision = '+' + subprocess.check_output(cmd).decode('ascii').rstrip()
    except:
        revision = '+local'
"""

FIX = """    # halo patch deepep-version-without-git: built from a pinned archive, not a checkout; the
    # version is the release's, with no git call (the commit is pinned in sources.toml).
    revision = ''
"""

PATCH = Patch(
    name="deepep-version-without-git",
    distribution="deep_ep",
    versions=">=2.1.0,<2.2",
    summary="the release version, without running git",
    edits=(Edit(file=FILE, defect=DEFECT, fix=FIX),),
    fixed_upstream=(),
)
