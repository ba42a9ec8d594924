/* STUB: to be written */
typedef int lowp_stub_wrap;
