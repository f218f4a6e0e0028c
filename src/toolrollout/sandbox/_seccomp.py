"""A tiny seccomp filter (classic BPF) that forbids creating user namespaces.

bubblewrap installs it (``--seccomp FD``) just before it starts the launcher. It denies
``unshare``/``clone`` with CLONE_NEWUSER (EPERM), ``clone3`` (ENOSYS: its flags live in
memory a filter cannot read) and every system call of a foreign ABI, whose numbers differ;
everything else is allowed. Why and what it leaves open: docs/sandbox.md.
"""

from __future__ import annotations

import platform
import struct

__all__ = ["userns_filter"]

_LD_W_ABS = 0x20
_JEQ = 0x15
_JGE = 0x35
_JSET = 0x45
_RET = 0x06

_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_EPERM = 1
_ENOSYS = 38
_CLONE_NEWUSER = 0x10000000

# seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16

_Instruction = tuple[int, str | None, str | None, int]
"""(opcode, jump-if-true label, jump-if-false label, k)."""

_ARCHES: dict[str, tuple[int, dict[str, int], int | None]] = {
    # machine: (AUDIT_ARCH_*, syscall numbers, first number of a foreign ABI sharing the arch)
    "x86_64": (0xC000003E, {"unshare": 272, "clone": 56, "clone3": 435}, 0x40000000),
    "aarch64": (0xC00000B7, {"unshare": 97, "clone": 220, "clone3": 435}, None),
}


def userns_filter(machine: str | None = None) -> bytes | None:
    """The filter for ``machine`` (default: this one) as bwrap reads it, or None when the
    architecture is not known here (then no filter is used)."""
    spec = _ARCHES.get(machine or platform.machine())
    if spec is None:
        return None
    audit_arch, numbers, foreign = spec
    # Labels (strings) mark positions; instructions jump to labels (resolved below).
    program: list[str | _Instruction] = [
        (_LD_W_ABS, None, None, _ARCH),
        (_JEQ, "native", "nosys", audit_arch),
        "native",
        (_LD_W_ABS, None, None, _NR),
    ]
    if foreign is not None:
        program += [(_JGE, "nosys", "not_foreign", foreign), "not_foreign"]
    program += [
        (_JEQ, "nosys", "not_clone3", numbers["clone3"]),
        "not_clone3",
        (_JEQ, "flags", "not_unshare", numbers["unshare"]),
        "not_unshare",
        (_JEQ, "flags", "allow", numbers["clone"]),
        "flags",
        (_LD_W_ABS, None, None, _ARG0_LOW),
        (_JSET, "perm", "allow", _CLONE_NEWUSER),
        "allow",
        (_RET, None, None, _ALLOW),
        "perm",
        (_RET, None, None, _ERRNO | _EPERM),
        "nosys",
        (_RET, None, None, _ERRNO | _ENOSYS),
    ]
    labels: dict[str, int] = {}
    instructions: list[_Instruction] = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(instructions)
        else:
            instructions.append(item)
    out = bytearray()
    for pc, (code, if_true, if_false, k) in enumerate(instructions):
        jt = labels[if_true] - pc - 1 if if_true else 0
        jf = labels[if_false] - pc - 1 if if_false else 0
        out += struct.pack("<HBBI", code, jt, jf, k)
    return bytes(out)
