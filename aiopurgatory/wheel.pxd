# C declarations for wheel.py, compiled with Cython in pure-Python mode (see setup.py).
# Keep in step with the .py file: every attribute in __slots__ is declared here.
cimport cython


cdef class _Bucket

cdef Py_ssize_t _NO_EXPIRATION


cdef class TimerEntry:  # not final: TimerTask and user code subclass it
    cdef public _Bucket _bucket
    cdef public TimerEntry _prev, _next
    cdef public Py_ssize_t deadline_tick


@cython.final
cdef class _Bucket:
    cdef public Py_ssize_t expiration, span, id
    cdef public TimerEntry head, tail

    cpdef void append(self, TimerEntry entry)
    @cython.locals(prev=TimerEntry, nxt=TimerEntry)
    cpdef void unlink(self, TimerEntry entry)


@cython.final
cdef class _Level:
    cdef public Py_ssize_t span, interval, now
    cdef public list buckets


@cython.final
cdef class TimingWheel:
    cdef Py_ssize_t _cascaded, _count, _next_id, _wheel_size
    cdef _Bucket _draining, _splitting
    cdef list _heap, _levels
    cdef list _split_into

    @cython.locals(level=_Level)
    cpdef Py_ssize_t schedule(self, TimerEntry entry, Py_ssize_t deadline_tick) except? -2
    @cython.locals(level=_Level, now=Py_ssize_t)
    cpdef Py_ssize_t clamp_future(self, Py_ssize_t tick) except -1
    @cython.locals(bucket=_Bucket)
    cpdef bint remove(self, TimerEntry entry) except -1
    cpdef Py_ssize_t reschedule(self, TimerEntry entry, Py_ssize_t deadline_tick) except? -2
    @cython.locals(found=list, bucket=_Bucket, entry=TimerEntry)
    cpdef list entries(self)
    @cython.locals(started=_Bucket, heap=list, bucket=_Bucket, key=Py_ssize_t)
    cpdef next_expiration(self)
    @cython.locals(heap=list, moved=Py_ssize_t, bucket=_Bucket, splitting=_Bucket,
                   top=_Bucket, key=Py_ssize_t)
    cpdef bint collect_due(self, Py_ssize_t now_tick, list out, Py_ssize_t limit) except -1
    cdef inline Py_ssize_t _key(self, _Bucket bucket) except? -2
    @cython.locals(current=Py_ssize_t, entry=TimerEntry)
    cdef Py_ssize_t _drain(self, _Bucket bucket, list out, Py_ssize_t moved,
                           Py_ssize_t limit) except -1
    @cython.locals(span=Py_ssize_t, first=Py_ssize_t, into=list, entry=TimerEntry,
                   virtual=Py_ssize_t, slot=Py_ssize_t, finer=_Bucket)
    cdef Py_ssize_t _split(self, _Bucket bucket, Py_ssize_t moved, Py_ssize_t limit) except -1
    @cython.locals(into=list, slot=Py_ssize_t)
    cdef void _forget_split(self)
    @cython.locals(level=_Level)
    cdef void _advance(self, Py_ssize_t tick)
    @cython.locals(deadline=Py_ssize_t, levels=list, k=Py_ssize_t, last=_Level, level=_Level,
                   virtual=Py_ssize_t, bucket=_Bucket, expiration=Py_ssize_t, key=Py_ssize_t)
    cdef Py_ssize_t _insert(self, TimerEntry entry) except? -2
