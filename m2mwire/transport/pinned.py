"""A dependency whose internals a transport reaches into: pinned to one minor version, checked at import.

Each compat module (websockets_compat, quic/compat, nats/compat) declares one :class:`Pinned` and
calls its checks when imported, so an unsupported version fails at once with the pip line to run,
instead of misbehaving later inside a private attribute that moved.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import version as installed_version

from m2mwire.errors import UnsupportedDependency

__all__ = ["Pinned", "Required"]

# (what it is called in the message, the object, names it must have)
Required = tuple[str, object, tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Pinned:
    package: str  # the distribution's name, as pip spells it
    minor: tuple[int, int]  # the minor version the compat module was read against and tested with
    transport: str  # the transport relying on it, in the user's terms
    alternative: str = ""  # what to do instead of installing it, if anything

    @property
    def requirement(self) -> str:
        major, minor = self.minor
        return f"{self.package}>={major}.{minor},<{major}.{minor + 1}"

    def _advice(self) -> str:
        return f"Install a supported version: pip install '{self.requirement}'{self.alternative}"

    def check_version(self, version: str | None = None) -> None:
        """Raise UnsupportedDependency unless ``version`` (default: the installed one) is of
        :attr:`minor`."""
        version = installed_version(self.package) if version is None else version
        try:
            found = tuple(int(part) for part in version.split(".")[:2])
        except ValueError:
            found = ()
        if found != self.minor:
            raise UnsupportedDependency(
                f"m2mwire's {self.transport} transport was verified against {self.package} "
                f"{self.minor[0]}.{self.minor[1]}.x and uses some of its internals; found "
                f"{self.package} {version}. {self._advice()}"
            )

    def check_attributes(self, required: Iterable[Required]) -> None:
        """Raise UnsupportedDependency naming every missing attribute."""
        missing = [
            f"{what}.{name}" for what, obj, names in required for name in names if not hasattr(obj, name)
        ]
        if missing:
            raise UnsupportedDependency(
                f"the installed {self.package} {installed_version(self.package)} lacks "
                f"{', '.join(missing)}, which m2mwire's {self.transport} transport relies on (verified "
                f"against {self.package} {self.minor[0]}.{self.minor[1]}.x). {self._advice()}"
            )
