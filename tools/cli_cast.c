/* STUB */ typedef int lowp_stub_unit;
