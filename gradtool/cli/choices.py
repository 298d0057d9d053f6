"""A click choice read from a registry when the command line is parsed, not when the
command is defined: a backend registered after ``gradtool.cli`` was imported (a test's,
a plugin's) is offered like the built-in ones."""

from __future__ import annotations

import click


class RegistryChoice(click.Choice):
    """``click.Choice`` whose choices are ``names()`` at each use (help, parsing)."""

    def __init__(self, names, case_sensitive: bool = True):
        self._names = names
        super().__init__((), case_sensitive)

    @property
    def choices(self) -> tuple:
        return tuple(self._names())

    @choices.setter
    def choices(self, value) -> None:     # click.Choice.__init__ assigns; the registry rules
        pass


__all__ = ["RegistryChoice"]
