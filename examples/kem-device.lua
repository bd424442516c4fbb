-- Calling the kem@1.0 device from an ao process on a HyperBEAM node.
--
-- ao.resolve returns two values: a status string ("ok" or "error") and the
-- reply as a table. On success res.status is 200, res.body the kernel's
-- output bytes as a Lua string, and res["kem-usage-us"],
-- res["kem-usage-bytes-in"], ... what the call cost. On failure res.status
-- is 4xx/5xx, res.error and res.reason (e.g. "kernel_not_found") say what
-- failed, and res.body is a JSON string with error, reason and details (why,
-- in the kernel's or the request's words: never a header, since issue 24).
--
-- The node must let Lua see kem@1.0: see README, "From Lua and ao processes".
--
-- "double" is one of kem's example kernels; a published kernel is named by
-- its 43-character Arweave transaction ID instead.

local KEM_REQUEST_BODY = '{"kernel_id":"double","input_data":[1,3,5,7],"output_size_hint":1}'

function double_on_gpu(base, req, opts)
    local status, res = ao.resolve({
        device = "kem@1.0",
        path = "execute_kernel",
        method = "POST",
        body = KEM_REQUEST_BODY
    })
    if status ~= "ok" then
        base.kem_error = { status = res.status, reason = res.reason, body = res.body }
        return base
    end
    -- res.body is "\2\6\10\14": each little-endian u32 word doubled.
    local bytes = {}
    for i = 1, #res.body do
        bytes[i] = string.byte(res.body, i)
    end
    base.kem_result = bytes
    return base
end
