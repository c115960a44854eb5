"""Briefcase's entry package for the Ferry app bundle.

Briefcase starts a bundled app as ``python -m <app name>``; Ferry's code is
the ``app`` package, installed into the bundle from the Ferry wheel (which
carries the compiled C core). This package only hands over to it.
"""
