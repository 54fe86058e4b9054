# C declarations for purgatory.py, compiled with Cython in pure-Python mode (see
# setup.py). Keep in step with the .py file: every attribute in __slots__ is declared
# here.
cimport cython

from .operation cimport DelayedOperation, OperationOwner
from .timer cimport Timer, collectable, is_timed
from .timeouts cimport WheelTimeouts


cdef object _COMPLETED, _EXPIRED, _CANCELLED

cdef extern from "pythread.h":
    unsigned long _thread_ident "PyThread_get_thread_ident"()

cdef extern from "Python.h":
    # id(): the object's address as an int (the C argument is a void *).
    object _object_id "PyLong_FromVoidPtr"(object op)
    # What the .py file defines as no-ops for pure Python (the ground rule on the GC).
    void _gc_untrack "PyObject_GC_UnTrack"(object op)
    void _gc_track "PyObject_GC_Track"(object op)
    bint _gc_is_tracked "PyObject_GC_IsTracked"(object op)


@cython.final
cdef class _Link:
    cdef _Link next, prev, sibling
    cdef DelayedOperation op
    cdef _WatchList owner


@cython.final
cdef class _WatchList:
    cdef readonly object key
    cdef _Link head, tail
    cdef readonly Py_ssize_t size

    @cython.locals(link=_Link, tail=_Link)
    cdef append(self, DelayedOperation op)
    @cython.locals(prev=_Link, nxt=_Link)
    cdef unlink(self, _Link link)
    @cython.locals(link=_Link, out=list, op=DelayedOperation)
    cpdef list ops(self, Py_ssize_t limit=*)


cdef class Purgatory(OperationOwner):  # not final: users subclass it
    cdef object _clock, _loop, _loop_running, _max_pending, _max_work, _notify_handle, _observer
    cdef object _purge_interval, _registering, _tick, _wheel_size
    cdef WheelTimeouts _timeouts
    cdef public object name
    cdef bint _closed, _stock_loop
    cdef dict _notified, _watchers
    cdef Py_ssize_t _pending, _purged, _watched
    cdef Py_ssize_t _n_cancelled, _n_closed, _n_completed, _n_expired
    cdef double _registering_start
    cdef readonly Timer _timer

    @cython.locals(timer=Timer, created=cython.double, start=cython.double, watchers=dict,
                   shared=_WatchList)
    cpdef try_complete_else_watch(self, DelayedOperation op, keys)
    @cython.locals(op=DelayedOperation, completed=Py_ssize_t, shared=_WatchList)
    cpdef check_and_complete(self, key, limit=*)
    cpdef _operation_detached(self, DelayedOperation op)
    @cython.locals(watchers=dict, removed=Py_ssize_t, link=_Link, nxt=_Link, shared=_WatchList)
    cdef _unwatch(self, DelayedOperation op)
    cpdef _operation_recorded(self, DelayedOperation op, outcome)
    @cython.locals(timer=Timer)
    cpdef _reset_timeout(self, DelayedOperation op, timeout)
    cpdef _bound_loop(self)
    cpdef _event_loop(self)
    cpdef _check_thread(self, DelayedOperation op, str method)
    @cython.locals(timer=Timer)
    cdef Timer _enter(self)
    @cython.locals(timer=Timer, timeouts=WheelTimeouts)
    cpdef WheelTimeouts _wheel_timeouts(self)
    @cython.locals(op=DelayedOperation, completed=Py_ssize_t, tried=dict)
    cdef Py_ssize_t _check_some(self, _WatchList shared, limit) except -1


@cython.locals(link=_Link)
cdef _track_links(DelayedOperation op)
@cython.locals(n=Py_ssize_t)
cdef tuple _unique_keys(keys)
@cython.locals(n=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, h=Py_hash_t)
cdef bint _distinct(tuple keys, Py_ssize_t n) except -1
