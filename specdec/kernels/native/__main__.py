"""`python -m specdec.kernels.native`: build the native kernels now, so a first model load
does not wait for them (`make demo` builds them while it pulls the models)."""

from specdec.kernels import native

if native._build() is None:
    print(f"specdec: no native kernels here: {native.build_errors.get('native', 'turned off')}")
