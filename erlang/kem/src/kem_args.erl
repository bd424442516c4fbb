%%% @doc Argument checks of the public Erlang API (`kem').
%%%
%%% A caller inside the node can pass any term. Every argument of a kernel
%%% call is checked here, in Erlang, before anything is framed for a port:
%%% a bad one is `{error, {bad_args, Detail}}' (or `too_large'), never an
%%% exception, and never a term that reaches a port owner or a port.
%%% Sizes are only bounded here (so a number with a million digits is not
%%% sent to the port's decoder); the port checks them against its limits.
-module(kem_args).

-export([call/3, execute_opts/1, timeout/1, output_size/3, payload/1]).

%% The longest timeout a call may ask for: longer ones are mistakes, and an
%% unchecked one beyond 2^32 - 1 ms would crash the port owner's timer.
-define(MAX_TIMEOUT_MS, 3600000).
%% No size or hint above this is sent to a port (256 TiB: far over any
%% limit kem has, far under a number that is costly to decode).
-define(MAX_SIZE, (1 bsl 48)).
-define(MAX_WORKGROUPS, (1 bsl 32)).
-define(MAX_ENTRY_POINT, 128).
%% A kernel's overrides are few (the WebGPU samples declare 1-4); the port
%% takes at most 64 (kem_port/wire/protocol.py MAX_CONSTANTS), names as
%% WGSL identifiers of at most 128 bytes, values within 64 bits.
-define(MAX_CONSTANTS, 64).
-define(MAX_CONSTANT, (1 bsl 64)).
-define(IS_GROUPS(N), (is_integer(N) andalso N >= 1 andalso N =< ?MAX_WORKGROUPS)).
-define(KERNEL_METHODS, [execute_kernel, execute_kernel_with_params, execute]).
%% The port's own default for max_input_bytes (kem_port/config.py): an
%% input over the port's limit would make a frame the port cannot read and
%% can answer to no caller, so that caller would wait out its timeout and
%% cost the port a restart. Checked here first.
-define(DEFAULT_MAX_INPUT, (256 bsl 20)).
-define(DEFAULT_MAX_PARAMS, (64 bsl 10)).
%% Kernel ids are at most 128 characters (the port's rule); anything much
%% longer is refused before it makes a frame.
-define(MAX_KERNEL_ID, 1024).

-type error() :: {error, {bad_args | too_large, binary()}}.
-export_type([error/0]).

%% @doc Check a call as `kem:call/3' receives it.
-spec call(term(), term(), term()) -> ok | error().
call(Method, Args, Timeout) when is_atom(Method), is_tuple(Args) ->
    first_error([fun() -> timeout(Timeout) end, fun() -> kernel_args(Method, Args) end]);
call(_Method, _Args, _Timeout) ->
    bad(<<"call(Method :: atom(), Args :: tuple(), Timeout)">>).

%% @doc A timeout in ms: 1 .. 3,600,000, or `infinity'.
-spec timeout(term()) -> ok | error().
timeout(infinity) -> ok;
timeout(T) when is_integer(T), T >= 1, T =< ?MAX_TIMEOUT_MS -> ok;
timeout(_) -> bad(<<"timeout must be an integer of 1..3600000 ms or infinity">>).

%% @doc Bytes a session or chain sends through the pipe (an input, a
%% buffer's contents): at most the port's max_input_bytes, or the frame
%% would be one the port can answer to no caller. Anything but a binary is
%% left to the callee's own shape check.
-spec payload(term()) -> ok | error().
payload(Bytes) when is_binary(Bytes), byte_size(Bytes) > 0 ->
    case byte_size(Bytes) =< limit(max_input_bytes, ?DEFAULT_MAX_INPUT) of
        true -> ok;
        false -> too_large(<<"the bytes are over the port's max_input_bytes">>)
    end;
payload(_) -> ok.

%% @doc Split `kem:execute/3''s options into the timeout, the caller's
%% output budget, whether usage is wanted and the options for the port,
%% each one checked.
-spec execute_opts(map()) ->
    {ok, timeout() | default, non_neg_integer() | infinity, boolean(), map()} | error().
execute_opts(Opts) ->
    {Timeout, Rest1} = take(timeout, Opts, default),
    {Budget, Rest2} = take(max_output_bytes, Rest1, infinity),
    {Usage, PortOpts} = take(usage, Rest2, false),
    first_error([fun() -> case Timeout of default -> ok; _ -> timeout(Timeout) end end,
                 fun() -> budget(Budget) end,
                 fun() -> case is_boolean(Usage) of true -> ok; false -> bad(<<"usage must be true or false">>) end end,
                 fun() -> port_opts(PortOpts) end],
                {ok, Timeout, Budget, Usage, PortOpts}).

%% @doc The output size a checked kernel call asks for.
-spec output_size(atom(), binary(), term()) -> non_neg_integer().
output_size(execute_kernel, Input, Hint) -> byte_size(Input) * Hint;
output_size(execute_kernel_with_params, Input, _Params) -> byte_size(Input);
output_size(execute, _Input, #{output_size := Size}) -> Size;
output_size(execute, Input, Opts) -> byte_size(Input) * maps:get(output_size_hint, Opts, 1).

%%% internals

take(Key, Map, Default) ->
    case maps:take(Key, Map) of
        {Value, Rest} -> {Value, Rest};
        error -> {Default, Map}
    end.

budget(infinity) -> ok;
budget(N) when is_integer(N), N >= 0, N =< ?MAX_SIZE -> ok;
budget(_) -> bad(<<"max_output_bytes must be an integer >= 0">>).

kernel_args(run, {K, Buffers, Opts}) when is_binary(K), is_map(Buffers), is_map(Opts) ->
    run_args(K, maps:values(Buffers));
kernel_args(run, _) ->
    bad(<<"run takes {KernelId :: binary(), Buffers :: #{Name => binary()}, Opts :: map()}">>);
kernel_args(Method, Args) ->
    case lists:member(Method, ?KERNEL_METHODS) of
        true -> kernel_args1(Method, Args);
        false -> ok
    end.

kernel_args1(_Method, {K, _I, _Third}) when is_binary(K), byte_size(K) > ?MAX_KERNEL_ID ->
    {error, {invalid_kernel_id, <<"a kernel id is 1-128 letters, digits, '-' or '_'">>}};
kernel_args1(Method, {K, I, Third}) when is_binary(K), is_binary(I) ->
    case byte_size(I) =< limit(max_input_bytes, ?DEFAULT_MAX_INPUT) of
        true -> third(Method, Third);
        false -> too_large(<<"the input is over the port's max_input_bytes">>)
    end;
kernel_args1(execute_kernel, _) ->
    bad(<<"execute_kernel takes {KernelId :: binary(), Input :: binary(), OutputSizeHint :: pos_integer()}">>);
kernel_args1(execute_kernel_with_params, _) ->
    bad(<<"execute_kernel_with_params takes {KernelId :: binary(), Input :: binary(), Params :: binary()}">>);
kernel_args1(execute, _) ->
    bad(<<"execute takes {KernelId :: binary(), Input :: binary(), Opts :: map()}">>).

%% A run's buffers: binaries, together within the port's max_input_bytes
%% (the port checks names, outputs and the rest: wire/run_requests.py).
run_args(K, _Values) when byte_size(K) > ?MAX_KERNEL_ID ->
    {error, {invalid_kernel_id, <<"a kernel id is 1-128 letters, digits, '-' or '_'">>}};
run_args(_K, Values) ->
    case lists:all(fun is_binary/1, Values) of
        false -> bad(<<"each buffer's contents must be a binary">>);
        true ->
            case lists:sum([byte_size(V) || V <- Values]) =< limit(max_input_bytes, ?DEFAULT_MAX_INPUT) of
                true -> ok;
                false -> too_large(<<"the buffers are over the port's max_input_bytes">>)
            end
    end.

third(execute_kernel, Hint) -> hint(Hint);
third(execute_kernel_with_params, P) when is_binary(P) -> params(P);
third(execute_kernel_with_params, _) -> bad(<<"Params must be a binary">>);
third(execute, Opts) when is_map(Opts) -> port_opts(Opts);
third(execute, _) -> bad(<<"Opts must be a map">>).

port_opts(Opts) ->
    Both = fun(A, B) -> maps:is_key(A, Opts) andalso maps:is_key(B, Opts) end,
    case maps:size(Opts) > 10 of
        true -> bad(<<"too many options">>);
        false ->
            case {Both(output_size, output_size_hint), Both(grid, workgroups)} of
                {true, _} -> bad(<<"give output_size or output_size_hint, not both">>);
                {_, true} -> bad(<<"give grid (invocations) or workgroups, not both">>);
                _ -> first_error([fun() -> opt(K, V) end || {K, V} <- maps:to_list(Opts)])
            end
    end.

opt(output_size_hint, V) -> hint(V);
opt(output_size, V) when is_integer(V), V >= 0, V =< ?MAX_SIZE -> ok;
opt(output_size, V) when is_integer(V), V > ?MAX_SIZE -> too_large(<<"output_size is over any limit">>);
opt(output_size, _) -> bad(<<"output_size must be an integer >= 0">>);
opt(params, V) when is_binary(V) -> params(V);
opt(params, _) -> bad(<<"params must be a binary">>);
opt(workgroups, {X, Y, Z}) when ?IS_GROUPS(X), ?IS_GROUPS(Y), ?IS_GROUPS(Z) -> ok;
opt(workgroups, _) -> bad(<<"workgroups must be {X, Y, Z} of integers 1..2^32">>);
%% Invocations, bounded as workgroups are: the port divides them by the
%% kernel's workgroup size and checks the device's per-dimension limit.
opt(grid, {X, Y, Z}) when ?IS_GROUPS(X), ?IS_GROUPS(Y), ?IS_GROUPS(Z) -> ok;
opt(grid, _) -> bad(<<"grid must be {X, Y, Z} of integers 1..2^32 (invocations)">>);
opt(constants, Map) when is_map(Map), map_size(Map) =< ?MAX_CONSTANTS ->
    first_error([fun() -> constant(K, V) end || {K, V} <- maps:to_list(Map)]);
opt(constants, Map) when is_map(Map) -> too_large(<<"at most 64 constants">>);
opt(constants, _) -> bad(<<"constants must be a map #{Name => Number}">>);
opt(entry_point, V) when is_atom(V) -> ok;
opt(entry_point, V) when is_binary(V), byte_size(V) =< ?MAX_ENTRY_POINT -> ok;
opt(entry_point, _) -> bad(<<"entry_point must be an atom or a binary of at most 128 bytes">>);
opt(debug, V) when is_boolean(V) -> ok;  % the debug channel (docs/debug.md)
%% The call's gas budget (docs/metering.md); the port counts gas in 64 bits.
opt(gas_limit, V) when is_integer(V), V > 0, V < 1 bsl 63 -> ok;
opt(gas_limit, _) -> bad(<<"gas_limit must be an integer 1..2^63-1 (docs/metering.md)">>);
opt(debug, _) -> bad(<<"debug must be true or false">>);
opt(timeout, _) -> bad(<<"timeout is an option of kem:execute/3, not of a port call">>);
opt(Key, _) when is_atom(Key) ->
    bad(<<"unknown option ", (atom_to_binary(Key, utf8))/binary,
          "; known: output_size_hint, output_size, params, workgroups, grid, constants, entry_point, timeout, "
          "max_output_bytes, usage, debug, gas_limit">>);
opt(_, _) -> bad(<<"option keys are atoms">>).

%% An override's name (atom or binary, checked as a WGSL name by the port)
%% and a number; whether the kernel declares it, and its type's range, are
%% the port's to check (kem_port/gpu/constants.py).
constant(K, V) when (is_atom(K) andalso K =/= true andalso K =/= false) orelse
                    (is_binary(K) andalso byte_size(K) >= 1 andalso byte_size(K) =< ?MAX_ENTRY_POINT) ->
    case (is_integer(V) andalso abs(V) =< ?MAX_CONSTANT) orelse is_float(V) of
        true -> ok;
        false -> bad(<<"constants values must be integers (within 64 bits) or floats">>)
    end;
constant(_, _) -> bad(<<"constants keys must be atoms or binaries of at most 128 bytes">>).

hint(V) when is_integer(V), V >= 1, V =< ?MAX_SIZE -> ok;
hint(V) when is_integer(V), V > ?MAX_SIZE -> too_large(<<"output_size_hint is over any limit">>);
hint(_) -> bad(<<"output_size_hint must be an integer > 0">>).

params(P) ->
    case byte_size(P) =< limit(max_params_bytes, ?DEFAULT_MAX_PARAMS) of
        true -> ok;
        false -> too_large(<<"params are over the port's max_params_bytes">>)
    end.

%% A port setting from the app env (passed to the port as KEM_<KEY>), else
%% the port's default.
limit(Key, Default) ->
    case application:get_env(kem, Key) of
        {ok, N} when is_integer(N), N > 0 -> N;
        _ -> Default
    end.

first_error(Checks) -> first_error(Checks, ok).

first_error([], Ok) -> Ok;
first_error([Check | Rest], Ok) ->
    case Check() of
        ok -> first_error(Rest, Ok);
        Error -> Error
    end.

bad(Detail) -> {error, {bad_args, Detail}}.
too_large(Detail) -> {error, {too_large, Detail}}.
