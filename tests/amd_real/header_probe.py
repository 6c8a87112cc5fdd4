"""What the real ROCm headers say, as the system C++ compiler reads them.

The headers are read by ``c++`` itself, not by us: a generated program includes them
and prints the value of every enumerator asked for, ``sizeof`` and ``offsetof`` of
struct fields, the values of macros, and for each function the kind and size of its
return type and of every parameter (through a template over the function's type, so a
typedef or an array parameter is seen as the compiler sees it). Only the *names* of
the enumerators of an enum are taken from the header text (C++ cannot list them), and
a name read wrongly would fail to compile, not pass.

The hipBLASLt header is C++ only (it includes ``<memory>``, and its structs have
default member initialisers), so the probe is C++17 with ``__HIP_PLATFORM_AMD__``.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Param:
    """One parameter or return type as the compiler sees it: kind, size, enum name."""

    kind: str  # "ptr", "enum", "int", "uint", "float", "void", "other"
    size: int
    type_name: str = ""  # the enum's name (demangled), for kind "enum"

    def __str__(self) -> str:
        return f"{self.kind}{self.size}" + (f"({self.type_name})" if self.type_name else "")


@dataclass
class HeaderFacts:
    """Everything one probe printed."""

    enums: dict[str, dict[str, int]] = field(default_factory=dict)  # enum type -> {name: value}
    values: dict[str, int] = field(default_factory=dict)  # macros and single enumerators asked for
    sizes: dict[str, int] = field(default_factory=dict)  # type or "Type.field" -> sizeof
    offsets: dict[str, int] = field(default_factory=dict)  # "Type.field" -> offsetof
    functions: dict[str, tuple[Param, tuple[Param, ...]]] = field(default_factory=dict)


_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


def enumerators(text: str, type_name: str) -> list[str]:
    """Names of the enumerators of ``typedef enum ... { ... } type_name;`` in ``text``."""
    text = _COMMENTS.sub(" ", text)
    found = re.search(r"\benum\b[^{};]*\{([^{}]*)\}\s*" + re.escape(type_name) + r"\s*;", text)
    if found is None:
        msg = f"no 'typedef enum {{...}} {type_name};' in the header text"
        raise LookupError(msg)
    names = []
    for line in found.group(1).splitlines():
        if line.strip().startswith("#"):
            msg = f"{type_name} has a preprocessor line in its body ({line.strip()}): read it by hand"
            raise LookupError(msg)
    for item in found.group(1).split(","):
        name = re.match(r"\s*([A-Za-z_]\w*)", item)
        if name:
            names.append(name.group(1))
    return names


_PRELUDE = r"""
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cxxabi.h>
#include <type_traits>
#include <typeinfo>

template <class T> static void kind() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_void_v<U>) std::printf(" void0");
    else if constexpr (std::is_pointer_v<U>) std::printf(" ptr%zu", sizeof(U));
    else if constexpr (std::is_enum_v<U>) {
        int status = 0;
        char* name = abi::__cxa_demangle(typeid(U).name(), nullptr, nullptr, &status);
        std::printf(" enum%zu:%s", sizeof(U), status == 0 ? name : typeid(U).name());
        std::free(name);
    }
    else if constexpr (std::is_floating_point_v<U>) std::printf(" float%zu", sizeof(U));
    else if constexpr (std::is_integral_v<U>) std::printf(" %s%zu", std::is_signed_v<U> ? "int" : "uint", sizeof(U));
    else std::printf(" other%zu", sizeof(U));
}

// The function's type, never its address: nothing is linked against the library.
template <class F> struct Sig;
template <class R, class... A> struct Sig<R (*)(A...)> {
    static void print(const char* name) {
        std::printf("fn %s", name);
        kind<R>();
        std::printf(" |");
        (kind<A>(), ...);
        std::printf("\n");
    }
};
"""


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def probe_source(
    headers: Sequence[str],
    enums: Mapping[str, Sequence[str]],
    values: Iterable[str] = (),
    structs: Mapping[str, Sequence[str]] | None = None,
    sizes: Iterable[str] = (),
    functions: Iterable[str] = (),
    defines: Iterable[str] = (),
) -> str:
    """The C++ program that prints the facts asked for (see the module docstring)."""
    lines = [
        *(f"#define {d}" for d in defines),
        *(f"#include <{h}>" for h in headers),
        _PRELUDE,
        "int main() {",
    ]
    for enum, names in enums.items():
        for name in names:
            lines.append(
                f'    std::printf("enum %s %s %lld\\n", {_c_string(enum)}, {_c_string(name)}, (long long)({name}));'
            )
    for name in values:
        lines.append(f'    std::printf("value %s %lld\\n", {_c_string(name)}, (long long)({name}));')
    for type_name in sizes:
        lines.append(f'    std::printf("size %s %zu\\n", {_c_string(type_name)}, sizeof({type_name}));')
    for struct, fields in (structs or {}).items():
        lines.append(f'    std::printf("size %s %zu\\n", {_c_string(struct)}, sizeof({struct}));')
        for name in fields:
            key = _c_string(f"{struct}.{name}")
            lines.append(
                f'    std::printf("field %s %zu %zu\\n", {key}, offsetof({struct}, {name}), '
                f"sizeof((({struct}*)nullptr)->{name}));"
            )
    for name in functions:
        lines.append(f"    Sig<decltype(&{name})>::print({_c_string(name)});")
    lines += ["    return 0;", "}", ""]
    return "\n".join(lines)


def _param(word: str) -> Param:
    spec, _, type_name = word.partition(":")
    kind = spec.rstrip("0123456789")
    return Param(kind, int(spec[len(kind) :]), type_name)


def parse_output(text: str) -> HeaderFacts:
    facts = HeaderFacts()
    for line in text.splitlines():
        tag, _, rest = line.partition(" ")
        if tag == "enum":
            enum, name, value = rest.split()
            facts.enums.setdefault(enum, {})[name] = int(value)
        elif tag == "value":
            name, value = rest.split()
            facts.values[name] = int(value)
        elif tag == "size":
            name, value = rest.split()
            facts.sizes[name] = int(value)
        elif tag == "field":
            name, offset, size = rest.split()
            facts.offsets[name] = int(offset)
            facts.sizes[name] = int(size)
        elif tag == "fn":
            head, _, params = rest.partition(" |")
            name, ret = head.split()
            facts.functions[name] = (_param(ret), tuple(_param(p) for p in params.split()))
    return facts


def compiler() -> str:
    found = shutil.which("c++") or shutil.which("g++")
    if found is None:
        msg = "no C++ compiler (c++ / g++) on PATH: the header probe needs the system compiler"
        raise FileNotFoundError(msg)
    return found


def run_probe(source: str, include: Path, workdir: Path) -> HeaderFacts:
    """Compile ``source`` against ``include`` with the system compiler, run it, parse it."""
    cpp, exe = workdir / "probe.cpp", workdir / "probe"
    cpp.write_text(source)
    cmd = [
        compiler(),
        "-std=c++17",
        "-D__HIP_PLATFORM_AMD__",
        "-isystem",
        str(include),
        str(cpp),
        "-o",
        str(exe),
    ]
    built = subprocess.run(cmd, capture_output=True, text=True)
    if built.returncode != 0:
        msg = f"the header probe did not compile ({' '.join(cmd)}):\n{built.stderr[-6000:]}"
        raise RuntimeError(msg)
    ran = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    return parse_output(ran.stdout)


# --- ctypes, in the same terms ---------------------------------------------------------


def ctypes_param(ctype: Any) -> Param:
    """A ctypes type as a :class:`Param` (pointers of every sort are ``ptr``)."""
    if ctype is None:
        return Param("void", 0)
    pointer_like = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_wchar_p)
    if ctype in pointer_like or issubclass(ctype, (ctypes._Pointer, ctypes._CFuncPtr)):  # type: ignore[attr-defined]
        return Param("ptr", ctypes.sizeof(ctypes.c_void_p))
    if ctype in (ctypes.c_float, ctypes.c_double, ctypes.c_longdouble):
        return Param("float", ctypes.sizeof(ctype))
    signed = ctype(-1).value < 0
    return Param("int" if signed else "uint", ctypes.sizeof(ctype))


def mismatch(header: Param, ours: Any) -> str | None:
    """Why ``ours`` (a ctypes type) cannot stand for ``header``, or None when it can.

    An enum is passed as an int of its size: its signedness is the compiler's choice
    (g++ makes an enum of non-negative values unsigned) and does not change how a
    value below 2**31 is passed. Every other integer must match in sign and size.
    """
    mine = ctypes_param(ours)
    if header.kind == "enum":
        ok = mine.kind in ("int", "uint") and mine.size == header.size
    else:
        ok = (mine.kind, mine.size) == (header.kind, header.size)
    return None if ok else f"header {header}, ours {mine} ({getattr(ours, '__name__', ours)})"
