/* Scaler implementation (section of zero.h): DeepSpeed's DynamicLossScaler rule.

   overflow:    if hysteresis == 1 or cur_hysteresis == 1: scale = max(scale / factor, min)
                else cur_hysteresis -= 1;  last_overflow_iter = iter
   no overflow: if consecutive_hysteresis: cur_hysteresis = hysteresis
                if (iter - last_overflow_iter) % window == 0:
                    if not consecutive_hysteresis: cur_hysteresis = hysteresis
                    scale *= factor (kept if the product would not be finite)
   then iter += 1. */

ZERODEF zero_result zero_scaler_init(zero_scaler *scaler, const zero_scaler_desc *desc,
                                     zero_dtype param_dtype)
{
    zero_scaler s;
    zero_scaler_desc d;
    int mode;
    if (!scaler) return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_scaler_init: scaler is NULL");
    if (desc) {
        d = *desc;
    } else {
        memset(&d, 0, sizeof d);
    }
    mode = (int)d.mode;
    if (mode < ZERO_SCALER_DEFAULT || mode > ZERO_SCALER_NONE)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT, "zero_scaler_init: mode = %d", mode);
    if (mode == ZERO_SCALER_DEFAULT) {
        if (param_dtype == ZERO_F16)
            mode = ZERO_SCALER_DYNAMIC;
        else if (param_dtype == ZERO_BF16 || param_dtype == ZERO_F32 || param_dtype == ZERO_F64)
            mode = ZERO_SCALER_NONE;
        else
            return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                              "zero_scaler_init: param_dtype = %d: the default mode needs a "
                              "resolved dtype (f16, bf16, f32 or f64)",
                              (int)param_dtype);
    }
    if (d.init_scale == 0.0f) d.init_scale = 65536.0f;
    if (d.window == 0) d.window = 1000;
    if (d.hysteresis == 0) d.hysteresis = 2;
    if (d.min_scale == 0.0f) d.min_scale = 1.0f;
    if (d.factor == 0.0f) d.factor = 2.0f;
    /* !(x > 0) also refuses NaN */
    if (!(d.init_scale > 0.0f) || !isfinite(d.init_scale))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: init_scale = %g (must be finite and > 0)",
                          (double)d.init_scale);
    if (d.window < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: window = %d (must be >= 1)", d.window);
    if (d.hysteresis < 1)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: hysteresis = %d (must be >= 1)", d.hysteresis);
    if (!(d.min_scale > 0.0f) || !isfinite(d.min_scale))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: min_scale = %g (must be finite and > 0)",
                          (double)d.min_scale);
    if (!(d.factor > 1.0f) || !isfinite(d.factor))
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: factor = %g (must be finite and > 1)",
                          (double)d.factor);
    if (mode == ZERO_SCALER_DYNAMIC && d.min_scale > d.init_scale)
        return zero__fail(ZERO_ERROR_INVALID_ARGUMENT,
                          "zero_scaler_init: min_scale = %g is above init_scale = %g",
                          (double)d.min_scale, (double)d.init_scale);

    s.scale = mode == ZERO_SCALER_NONE ? 1.0f : d.init_scale;
    s.factor = d.factor;
    s.min_scale = d.min_scale;
    s.window = d.window;
    s.hysteresis = d.hysteresis;
    s.cur_hysteresis = d.hysteresis;
    s.consecutive_hysteresis = d.consecutive_hysteresis != 0;
    s.dynamic = mode == ZERO_SCALER_DYNAMIC;
    s.iter = 0;
    s.last_overflow_iter = -1;
    *scaler = s;
    return ZERO_OK;
}

ZERODEF void zero_scaler_update(zero_scaler *scaler, int overflow)
{
    if (!scaler) return;
    if (scaler->dynamic) {
        if (overflow) {
            if (scaler->hysteresis == 1 || scaler->cur_hysteresis == 1) {
                float cut = scaler->scale / scaler->factor;
                scaler->scale = cut > scaler->min_scale ? cut : scaler->min_scale;
            } else {
                scaler->cur_hysteresis -= 1;
            }
            scaler->last_overflow_iter = scaler->iter;
        } else {
            if (scaler->consecutive_hysteresis) scaler->cur_hysteresis = scaler->hysteresis;
            if ((scaler->iter - scaler->last_overflow_iter) % scaler->window == 0) {
                float grown = scaler->scale * scaler->factor;
                if (!scaler->consecutive_hysteresis) scaler->cur_hysteresis = scaler->hysteresis;
                if (isfinite(grown)) scaler->scale = grown; /* an inf scale would never recover */
            }
        }
    } else if (overflow) {
        scaler->last_overflow_iter = scaler->iter;
    }
    scaler->iter += 1;
}
