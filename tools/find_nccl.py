#!/usr/bin/env python3
"""Prints the directory of an NCCL installed from a PyPI wheel (the one holding include/nccl.h
and lib/libnccl.so.2), or nothing. The Makefile calls it when NCCL_HOME is not given.

Layouts looked for in every directory of sys.path (PYTHONPATH included) and of the site
module's lists, in that order:
  nvidia/nccl        nvidia-nccl-cu12 and older (PyTorch's dependency up to CUDA 12)
  nvidia/cu13, ...   CUDA 13 wheels, which install every library under nvidia/cu<major>
                     (the highest major first)
"""
import glob
import os
import site
import sys


def candidates():
    dirs = [p for p in sys.path if p]
    try:
        dirs += site.getsitepackages()
    except Exception:  # virtualenvs of old Pythons lack it
        pass
    try:
        dirs.append(site.getusersitepackages())
    except Exception:
        pass
    seen = set()
    for d in dirs:
        d = os.path.abspath(d)
        if d in seen:
            continue
        seen.add(d)
        cus = glob.glob(os.path.join(d, "nvidia", "cu[0-9]*"))
        cus.sort(key=lambda p: int("0" + "".join(c for c in os.path.basename(p)[2:] if c.isdigit())),
                 reverse=True)
        for c in [os.path.join(d, "nvidia", "nccl")] + cus:
            yield c


for c in candidates():
    if os.path.isfile(os.path.join(c, "include", "nccl.h")):
        print(c)
        break
