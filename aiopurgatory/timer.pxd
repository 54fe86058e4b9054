# C declarations for timer.py, compiled with Cython in pure-Python mode (see setup.py).
# Keep in step with the .py file: every attribute in __slots__ is declared here.
cimport cython

from .wheel cimport TimerEntry, TimingWheel


cdef extern from "math.h":
    double _ceil "ceil"(double x)  # the .py file's math.ceil when not compiled

cdef extern from *:
    # The .py file's time.monotonic when not compiled: CPython 3.11+ reads
    # CLOCK_MONOTONIC on Linux and converts its nanoseconds to seconds exactly so.
    """
    #if defined(__linux__)
    #include <time.h>
    #define AIOP_HAS_C_MONOTONIC 1
    static inline double aiop_monotonic(void) {
        struct timespec ts;
        long long t;
        volatile double d;  /* as CPython's _PyTime_AsSecondsDouble: no re-rounding */
        clock_gettime(CLOCK_MONOTONIC, &ts);
        t = (long long)ts.tv_sec * 1000000000LL + (long long)ts.tv_nsec;
        if (t % 1000000000LL == 0) {
            d = (double)(t / 1000000000LL);
        } else {
            d = (double)t;
            d /= 1e9;
        }
        return d;
    }
    #else
    #define AIOP_HAS_C_MONOTONIC 0
    static inline double aiop_monotonic(void) { return 0.0; }
    #endif
    """
    bint _HAS_C_MONOTONIC "AIOP_HAS_C_MONOTONIC"
    double _monotonic "aiop_monotonic"() nogil

cdef extern from "Python.h":
    # What the .py file defines as no-ops for pure Python (the ground rule on the GC).
    void _gc_untrack "PyObject_GC_UnTrack"(object op)
    void _gc_track "PyObject_GC_Track"(object op)
    bint _gc_is_tracked "PyObject_GC_IsTracked"(object op)

cpdef void collectable(TimerEntry task) noexcept

cdef double _MAX_TICK_F, _INFINITY, _NOT_TIMED
cdef Py_ssize_t _MAX_TICK_I, _NO_EXPIRATION


@cython.locals(x=cython.double, k=Py_ssize_t)
cpdef Py_ssize_t deadline_tick(double deadline, double tick, double origin=*) except? -1
@cython.locals(x=cython.double, k=Py_ssize_t)
cpdef Py_ssize_t clock_tick(double now, double tick, double origin=*) except? -1


cdef class TimerTask(TimerEntry):  # not final: DelayedOperation and user code subclass it
    cdef public double _deadline  # NaN while not timed; the property deadline says None

    cpdef _timer_fired(self)  # cpdef: Python subclasses override it


cpdef bint is_timed(TimerTask task) except -1


@cython.final
cdef class Timer:
    cdef object __weakref__
    cdef object _armed_tick, _call_at, _handle, _loop, _name, _on_failure, _task, _time, _wake
    cdef bint _c_clock, _closed, _early_alarm, _more, _running, _signalled
    cdef list _due
    cdef Py_ssize_t _due_index, _max_work, _wakeups
    cdef double _lag_last, _lag_max, _origin, _tick, _when
    cdef TimingWheel _wheel

    cpdef double now(self) except? -1.0
    @cython.locals(now=cython.double)
    cpdef add(self, TimerTask task, double timeout, start=*)
    cdef _place(self, TimerTask task, double deadline, double now)
    @cython.locals(now=cython.double, deadline=cython.double)
    cpdef reset(self, TimerTask task, double timeout)
    @cython.locals(wheel=TimingWheel, removed=bint)
    cpdef bint cancel(self, TimerTask task) except -1
    @cython.locals(wheel=TimingWheel, expiration=Py_ssize_t)
    cdef _schedule(self, TimerTask task, double deadline)
    cdef Py_ssize_t _due_tick(self, double deadline) except? -1
    cdef _arm_for(self, Py_ssize_t expiration)
    cdef _disarm(self)
    cdef _wake_task(self)
    @cython.locals(alarm=bint, wheel=TimingWheel, now=cython.double, now_tick=Py_ssize_t,
                   due=list, finished=bint, i=Py_ssize_t, task=TimerTask,
                   earliest=cython.double, lag=cython.double, deadline=cython.double)
    cdef _work(self)
    cdef _fire(self, TimerTask task)
