# C declarations for timeouts.py, compiled with Cython in pure-Python mode (see
# setup.py). Keep in step with the .py file: every attribute in __slots__ is declared
# here. What a request pays per deadline (arm, disarm, fire) is cpdef; the API users
# call stays Python methods. The classes are not @cython.final: Cython does not let a
# final class override an inherited cpdef method (_timer_fired), and the override
# check costs nothing for instances of the extension types themselves.
cimport cython

from .timer cimport Timer, TimerTask


cdef object _CREATED, _ENTERED, _EXPIRING, _EXPIRED, _EXITED, _CLOSING, _NUMBER
cdef double _INF
cdef bint _CHAINS_TIMEOUT_ERROR

@cython.locals(seconds=cython.double)
cpdef double check_delay(name, delay) except? -1.0
@cython.locals(seconds=cython.double)
cpdef check_deadline(name, when)


cdef class WheelTimeouts:
    cdef bint _closed
    cdef dict _live
    cdef object _loop, _name
    cdef Timer _timer

    cpdef Timeout timeout(self, delay)
    cpdef Timeout timeout_at(self, when)
    cpdef _check_open(self)
    cpdef _closed_error(self)
    @cython.locals(now=cython.double, delay=cython.double)
    cpdef bint _arm(self, TimerTask entry, double when) except -1
    cpdef _disarm(self, TimerTask entry)
    cpdef _fired(self, TimerTask entry)


cdef class _Armed(TimerTask):
    cdef WheelTimeouts _owner

    cdef _attach(self, WheelTimeouts owner)
    cpdef _closed(self, error)


cdef class Timeout(_Armed):
    cdef Py_ssize_t _cancelling
    cdef object _soon, _state, _task, _when

    cpdef _set_alarm(self, double when)
    cpdef _cancel_alarm(self)
    cpdef _timer_fired(self)
    cpdef _expire(self)
    cpdef _closed(self, error)


cdef class TimerHandle(_Armed):
    cdef bint _cancelled
    cdef tuple _args
    cdef object _callback, _context, _soon
    cdef double _when

    cpdef _arm(self)
    cpdef _timer_fired(self)
    cpdef _run(self)
    cpdef _closed(self, error)


cdef class _Wakeup(_Armed):
    cdef object _future, _result

    cpdef _timer_fired(self)
    cpdef _closed(self, error)
