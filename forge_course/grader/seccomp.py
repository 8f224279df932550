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

A second filter (`signal_program`) is installed by each grading job itself, once its set-up is
done and before learner code runs. A Python signal handler is called with the frame the signal
interrupted, and from that frame `f_back` leads to the job's own (its hidden cases, its channel
to the grader), a route no audit hook sees. So from then on no handler can be installed: an
``rt_sigaction`` that sets one is refused (one that only reads is not), in the job and in every
process it starts. The job's processes keep the handlers they had: none of them Python code.
"""

from __future__ import annotations

import ctypes
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


# -- the job's filter: no signal handler once learner code runs -------------------------------

SIGNAL_CALLS = {"x86_64": {"rt_sigaction": 13, "seccomp": 317},
                "aarch64": {"rt_sigaction": 134, "seccomp": 277}}  # fmt: skip
NEW_HANDLER_LOW, NEW_HANDLER_HIGH = 24, 28  # rt_sigaction's 2nd argument, in seccomp_data
PR_SET_NO_NEW_PRIVS, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC = 38, 1, 1


def signal_program(machine: str | None = None) -> bytes | None:
    """The job's filter for ``machine`` (this one by default); None where it is unknown."""
    machine = machine or platform.machine()
    if machine not in SIGNAL_CALLS:
        return None
    code = [_op(LD_W_ABS, ARCH), _op(JEQ_K, AUDIT_ARCH[machine], jt=1), _op(RET_K, KILL)]
    code.append(_op(LD_W_ABS, NR))
    if machine == "x86_64":
        code += [_op(JGE_K, X32_BIT, jf=1), _op(RET_K, ERRNO | EPERM)]
    code += [
        _op(JEQ_K, SIGNAL_CALLS[machine]["rt_sigaction"], jf=5),
        # The new handler's address: a null pointer (64 bits of zero) only reads the old one.
        _op(LD_W_ABS, NEW_HANDLER_LOW), _op(JEQ_K, 0, jf=2),
        _op(LD_W_ABS, NEW_HANDLER_HIGH), _op(JEQ_K, 0, jt=1),
        _op(RET_K, ERRNO | EPERM),
        _op(RET_K, ALLOW),
    ]  # fmt: skip
    return b"".join(code)


class _Program(ctypes.Structure):  # struct sock_fprog
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install_signal_filter() -> bool:
    """Install `signal_program` on every thread of this process (and so on all it starts).
    False where it cannot be: not Linux, an unknown machine, or a kernel without seccomp."""
    code = signal_program()
    if code is None or not hasattr(os, "sched_getaffinity"):  # Linux only
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return False
    # Without privileges, a filter needs no_new_privs (bubblewrap has set it already).
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    buffer = ctypes.create_string_buffer(code, len(code))
    program = _Program(len(code) // 8, ctypes.addressof(buffer))
    number = SIGNAL_CALLS[platform.machine()]["seccomp"]
    flags = SECCOMP_FILTER_FLAG_TSYNC  # the threads torch has started already included
    done = libc.syscall(ctypes.c_long(number), ctypes.c_long(SECCOMP_SET_MODE_FILTER),
                        ctypes.c_long(flags), ctypes.byref(program))  # fmt: skip
    return done == 0
