# C declarations for operation.py, compiled with Cython in pure-Python mode (see
# setup.py). Keep in step with the .py file: every attribute in __slots__ is declared
# here. The hooks users override (try_complete, on_complete, on_expiration) stay plain
# Python methods; what the owner and the timer call is cpdef or cdef.
from .timer cimport TimerTask


cdef class DelayedOperation

cdef object _COMPLETED, _EXPIRED, _CANCELLED, _CLOSED, _NO_RESULT
cdef double _INFINITY, _NOT_TIMED

cdef extern from "pythread.h":
    unsigned long _thread_ident "PyThread_get_thread_ident"()


cdef class OperationOwner:  # the purgatory subclasses it
    cdef unsigned long _thread

    cpdef _operation_detached(self, DelayedOperation op)
    cpdef _operation_recorded(self, DelayedOperation op, outcome)
    cpdef _reset_timeout(self, DelayedOperation op, timeout)
    cpdef _bound_loop(self)
    cpdef _event_loop(self)
    cpdef _check_thread(self, DelayedOperation op, str method)


cdef class DelayedOperation(TimerTask):  # not final: users subclass it in Python
    cdef public bint _checking, _recheck, expired
    cdef public object _exception, _exception_tb, _outcome, _result, _waiter
    cdef object _callbacks
    cdef public OperationOwner _owner
    cdef public object created, timeout
    cdef public tuple _keys
    cdef public object _links

    cpdef bint force_complete(self) except -1
    cpdef bint cancel(self, msg=*) except -1
    cpdef bint done(self) except -1
    cpdef bint cancelled(self) except -1
    cpdef bint _check(self) except -1
    cpdef _timer_fired(self)
    cpdef bint _abandon(self, closing) except -1
    cdef _close_error(self)
    cdef _run_completion(self, outcome)
    cdef _hook_raised(self, exc)
    cdef _cancelled_error(self)
    cdef _ensure_waiter(self)
    cdef _finish(self, exc)
    cdef _release(self)
    cdef _settle(self, OperationOwner owner)
    cdef _wake_waiters(self)
