%%% @doc Drop-in for the original `kem_nif' module (a Rust NIF).
%%%
%%% Same functions, guards and results, now binaries. Like the NIF, failures
%%% raise an `error' exception (the NIF panicked), so callers written as
%%% `try kem_nif:execute_kernel(...) catch error:E -> ... end' keep working;
%%% `E' is now a readable `{Reason, Detail}'.
-module(kem_nif).

-export([hello/0, execute_kernel/3, execute_kernel_with_params/3, adapter_info/0]).

-spec hello() -> binary().
hello() ->
    unwrap(kem:call(hello, {}, timeout())).

%% @doc Run KernelId on InputData; the output is byte_size(InputData) *
%% OutputSizeHint bytes.
-spec execute_kernel(binary(), binary(), pos_integer()) -> binary().
execute_kernel(KernelId, InputData, OutputSizeHint)
        when is_binary(KernelId), is_binary(InputData),
             is_integer(OutputSizeHint), OutputSizeHint > 0 ->
    unwrap(kem:call(execute_kernel, {KernelId, InputData, OutputSizeHint}, timeout())).

%% @doc Run KernelId with Params (32-bit little-endian words) bound as the
%% uniform at binding 2; the output is as large as InputData.
-spec execute_kernel_with_params(binary(), binary(), binary()) -> binary().
execute_kernel_with_params(KernelId, InputData, Params)
        when is_binary(KernelId), is_binary(InputData), is_binary(Params) ->
    unwrap(kem:call(execute_kernel_with_params, {KernelId, InputData, Params}, timeout())).

%% @doc JSON: name, vendor, device, driver, backend, driver_info (the
%% original's types: vendor and device integers, backend lower-case), and more.
-spec adapter_info() -> binary().
adapter_info() ->
    unwrap(kem:call(adapter_info, {}, timeout())).

unwrap({ok, Value}) -> Value;
unwrap({error, Reason}) -> erlang:error(Reason).

timeout() ->
    kem:default_timeout().
