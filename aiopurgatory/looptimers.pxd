# C declarations for looptimers.py, compiled with Cython in pure-Python mode (see setup.py).
# Keep in step with the .py file: every attribute in __slots__ is declared here.
cimport cython

from .wheel cimport TimerEntry, TimingWheel
# time.monotonic read in C where it is the same clock (timer.pxd says when).
from .timer cimport _HAS_C_MONOTONIC, _monotonic, clock_tick

cdef extern from *:
    # The slots of TimerHandle, read and written at their offsets (the module doc says
    # why). The .py file defines pure-Python stand-ins that are never called.
    """
    #include "structmember.h"
    static Py_ssize_t aiop_member_offset(PyObject *descriptor, PyObject *cls) {
        PyMemberDescrObject *d;
        PyMemberDef *m;
        if (Py_TYPE(descriptor) != &PyMemberDescr_Type || !PyType_Check(cls))
            return -1;
        d = (PyMemberDescrObject *)descriptor;
        m = d->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY))
            return -1;
        if (!PyType_IsSubtype((PyTypeObject *)cls, PyDescr_TYPE(d)))
            return -1;
        if (m->offset < (Py_ssize_t)sizeof(PyObject)
                || m->offset + (Py_ssize_t)sizeof(PyObject *) > ((PyTypeObject *)cls)->tp_basicsize)
            return -1;
        return m->offset;
    }
    static inline void aiop_put(PyObject *obj, Py_ssize_t offset, PyObject *value) {
        PyObject **slot = (PyObject **)((char *)obj + offset);
        PyObject *old = *slot;
        Py_INCREF(value);
        *slot = value;
        Py_XDECREF(old);
    }
    static inline PyObject *aiop_get(PyObject *obj, Py_ssize_t offset) {
        PyObject *value = *(PyObject **)((char *)obj + offset);
        if (value == NULL)
            value = Py_None;
        Py_INCREF(value);
        return value;
    }
    static inline PyObject *aiop_alloc(PyObject *cls) {
        return ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
    }
    /* A slot of a fresh object (NULL, from aiop_alloc): nothing to release. */
    static inline void aiop_init(PyObject *obj, Py_ssize_t offset, PyObject *value) {
        Py_INCREF(value);
        *(PyObject **)((char *)obj + offset) = value;
    }
    """
    Py_ssize_t _member_offset "aiop_member_offset"(object descriptor, object cls)
    void _put "aiop_put"(object obj, Py_ssize_t offset, object value)
    object _get "aiop_get"(object obj, Py_ssize_t offset)
    object _alloc "aiop_alloc"(object cls)
    Py_ssize_t _refcount "Py_REFCNT"(object obj)
    void _init "aiop_init"(object obj, Py_ssize_t offset, object value)

cdef extern from "Python.h":
    object _copy_context "PyContext_CopyCurrent"()

cdef Py_ssize_t _NO_EXPIRATION, _SPARE_ENTRIES
cdef double _INF
cdef bint _FAST
cdef Py_ssize_t _ARGS, _CALLBACK, _CANCELLED, _CONTEXT, _ENTRY, _LOOP, _REPR, _SCHEDULED
cdef Py_ssize_t _SOURCE_TRACEBACK, _WHEN

@cython.locals(timers=object)
cdef void _cancel_fast(object handle) except *


@cython.final
cdef class LoopEntry(TimerEntry):
    cdef public object handle
    cdef public LoopTimers _store

    cpdef void cancel(self) except *


@cython.final
cdef class LoopTimers:
    cdef public TimingWheel _wheel
    cdef public object _time, _clock
    cdef object _arm
    cdef public bint closed, debug
    cdef bint _monotonic_clock
    cdef double _tick, _origin
    cdef list _near, _out
    cdef LoopEntry _spare
    cdef Py_ssize_t _spares
    cdef Py_ssize_t _seq

    @cython.locals(origin=double, tick=double, wheel=TimingWheel, k=Py_ssize_t,
                   entry=LoopEntry, expiration=Py_ssize_t)
    cpdef object add(self, object handle, double when)
    cdef inline void _keep_spare(self, LoopEntry entry) noexcept
    @cython.locals(near=list, wheel=TimingWheel, origin=double, tick=double,
                   now_tick=Py_ssize_t, out=list, done=bint, entry=LoopEntry)
    cpdef double due(self, double end, object ready) except? -1.0
    @cython.locals(near=list, wake=double)
    cpdef double next_wake(self) except? -1.0


cdef object _timer(object loop, LoopTimers timers, object when, object callback, tuple args,
                   object context)
