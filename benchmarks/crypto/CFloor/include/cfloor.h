int hcf_dummy(void);
