/* STUB: to be written */
typedef int lowp_stub_fp8_state;
