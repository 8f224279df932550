"""A seccomp filter for the sandbox: the system calls no answer needs, refused with EPERM.

Bubblewrap installs a filter given as a compiled classic-BPF program (``bwrap --seccomp FD``).
The program here is small enough to read: check the architecture, refuse the other ABI of the
machine (x32 on x86-64), and answer EPERM to the calls that reach other processes' memory
(ptrace, process_vm_*), change mounts or namespaces (mount, umount2, pivot_root, unshare,
setns), touch the kernel's keyrings or load code into it (keyctl, add_key, request_key, bpf,
init_module, ...), watch the machine (perf_event_open, userfaultfd), or make IPC objects
that outlive their processes (System V shared memory, semaphores and message queues, POSIX
message queues: a worker serves one student after another, and these have no file to clear).
Everything else is allowed: torch, DataLoader workers and gloo need none of these (POSIX
shared memory and semaphores are files in /dev/shm, emptied after every job).
"""

from __future__ import annotations

import os
import platform
import struct

# Syscall numbers by machine, from the kernel's tables (arch/x86/entry/syscalls/syscall_64.tbl,
# include/uapi/asm-generic/unistd.h for arm64).
REFUSED = {
    "x86_64": {"ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "unshare": 272,
               "setns": 308, "keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321,
               "perf_event_open": 298, "userfaultfd": 323, "kexec_load": 246,
               "init_module": 175, "finit_module": 313, "delete_module": 176, "swapon": 167,
               "swapoff": 168, "reboot": 169, "process_vm_readv": 310,
               "process_vm_writev": 311, "open_by_handle_at": 304, "shmget": 29, "semget": 64,
               "msgget": 68, "mq_open": 240},
    "aarch64": {"ptrace": 117, "mount": 40, "umount2": 39, "pivot_root": 41, "unshare": 97,
                "setns": 268, "keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280,
                "perf_event_open": 241, "userfaultfd": 282, "kexec_load": 104,
                "init_module": 105, "finit_module": 273, "delete_module": 106, "swapon": 224,
                "swapoff": 225, "reboot": 142, "process_vm_readv": 270,
                "process_vm_writev": 271, "open_by_handle_at": 265, "shmget": 194,
                "semget": 190, "msgget": 186, "mq_open": 180},
}  # fmt: skip
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_BIT = 0x40000000

# Classic BPF: the instruction codes this program uses, and seccomp's return values.
LD_W_ABS, JEQ_K, JGE_K, RET_K = 0x20, 0x15, 0x35, 0x06
ALLOW, KILL, ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
NR, ARCH = 0, 4  # offsets of the syscall number and the architecture in seccomp_data
EPERM = 1


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The compiled filter for ``machine`` (this one by default); None where it is unknown."""
    machine = machine or platform.machine()
    if machine not in REFUSED:
        return None
    numbers = sorted(set(REFUSED[machine].values()))
    code = [_op(LD_W_ABS, ARCH), _op(JEQ_K, AUDIT_ARCH[machine], jt=1), _op(RET_K, KILL)]
    code.append(_op(LD_W_ABS, NR))
    if machine == "x86_64":  # the x32 ABI reaches the same calls under other numbers
        code += [_op(JGE_K, X32_BIT, jf=1), _op(RET_K, ERRNO | EPERM)]
    for i, number in enumerate(numbers):
        # Match: jump over the remaining tests and the ALLOW to the EPERM at the end.
        code.append(_op(JEQ_K, number, jt=len(numbers) - i))
    code += [_op(RET_K, ALLOW), _op(RET_K, ERRNO | EPERM)]
    return b"".join(code)


def open_program() -> int | None:
    """A readable file descriptor holding the program, for ``bwrap --seccomp FD``."""
    code = program()
    if code is None:
        return None
    read, write = os.pipe()
    os.write(write, code)  # a few hundred bytes: far below a pipe's buffer
    os.close(write)
    return read
