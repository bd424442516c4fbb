%%% @doc The usage record of a call: what it cost, for metering
%%% (`kem:usage()': kernel, bytes in and out, time, the node that ran it).
%%% Split out of `kem' (its module would pass the 400 lines the project
%%% allows, tests/test_architecture.py); `kem' builds each record here, from
%%% a call's arguments and reply, on its one road (`checked_call') and for
%%% session calls and chains (`counted').
%%%
%%% **Gas** (docs/metering.md) travels beside a reply only when the caller
%%% asks for usage (`kem:request_usage/2', `kem:call_usage/3',
%%% `kem:execute/3' with `usage => true'): `ask_gas/2' adds `usage => true'
%%% to the port's options and the port answers `{ok, {Result, #{gas => G}}}'
%%% (a shared-memory result: `{ok, {{shm, Path, Size}, #{gas => G}}}',
%%% kem_shm reads the file and keeps the map beside it); `take_gas/1' takes
%%% the map off before anyone else sees the reply. A call that does not ask
%%% is sent and answered byte for byte as before: `kem:execute/3''s `{ok,
%%% Bin}' and the hot `execute_kernel' frame are untouched. Any road may
%%% carry gas this way: a port method that answers `{Value, #{gas => G}}' to
%%% a call with `usage => true' in its options, and a clause in `ask_gas/2'.
-module(kem_usage).

-export([none/0, of_call/4, of_input/5, reply_bytes/1, kernel_and_input/1]).
-export([ask_gas/2, take_gas/1, with_gas/2, beside/2]).

%% @doc The record of a call refused before it ran: nothing used.
-spec none() -> kem:usage().
none() ->
    #{kernel_id => undefined, bytes_in => 0, bytes_out => 0, us => 0, clock => wall, node => node()}.

%% @doc The record of a call by Args (kernel id and input read from them)
%% that answered Reply after WallUs on Node.
-spec of_call(term(), term(), non_neg_integer(), node()) -> kem:usage().
of_call(Args, Reply, WallUs, Node) ->
    {KernelId, BytesIn} = kernel_and_input(Args),
    of_input(KernelId, BytesIn, Reply, WallUs, Node).

%% @doc The record of a call whose kernel id and input size are known.
-spec of_input(binary() | undefined, non_neg_integer(), term(), non_neg_integer(), node()) -> kem:usage().
of_input(KernelId, BytesIn, Reply, WallUs, Node) ->
    #{kernel_id => KernelId, bytes_in => BytesIn, bytes_out => reply_bytes(Reply), us => WallUs,
      clock => wall, node => Node}.

%% @doc A call's kernel id and input bytes, from its arguments: `{Kernel,
%% Input, Third}', a run's `{Kernel, #{Name => Bytes}, Opts}', else none.
-spec kernel_and_input(term()) -> {binary() | undefined, non_neg_integer()}.
kernel_and_input({K, Buffers, _Opts}) when is_binary(K), is_map(Buffers) ->  % run: named buffers
    {K, lists:sum([byte_size(B) || B <- maps:values(Buffers), is_binary(B)])};
kernel_and_input(Args) when tuple_size(Args) >= 2,
                            is_binary(element(1, Args)), is_binary(element(2, Args)) ->
    {element(1, Args), byte_size(element(2, Args))};
kernel_and_input(_) ->
    {undefined, 0}.

%% @doc A result's bytes: a binary, or a map of them (run's named buffers, a chain's return).
-spec reply_bytes(term()) -> non_neg_integer().
reply_bytes({ok, Bin}) when is_binary(Bin) -> byte_size(Bin);
reply_bytes({ok, Named}) when is_map(Named) -> lists:sum([byte_size(B) || B <- maps:values(Named), is_binary(B)]);
reply_bytes(_) -> 0.

%% @doc The method and arguments that ask the port for the call's gas:
%% `execute_kernel' with `usage' after its three arguments (the hot frame
%% plus one atom: the port's narrow reader and the reader's lone kit keep
%% it, docs/metering.md); `execute_kernel_with_params' as its `execute'
%% twin (params, an output of the input's size), and `usage => true' among
%% `execute''s options. A debug call answers its gas
%% in its debug map already; any other method is sent as it is.
-spec ask_gas(atom(), term()) -> {atom(), term()}.
ask_gas(execute_kernel, {K, I, Hint}) -> {execute_kernel, {K, I, Hint, usage}};  % the hot frame, the lone kit
ask_gas(execute_kernel_with_params, {K, I, P}) -> {execute, {K, I, #{params => P, usage => true}}};
ask_gas(execute, {K, I, #{debug := true} = Opts}) -> {execute, {K, I, Opts}};
ask_gas(execute, {K, I, Opts}) when is_map(Opts) -> {execute, {K, I, Opts#{usage => true}}};
ask_gas(run, {K, Buffers, Opts}) when is_map(Opts) -> {run, {K, Buffers, Opts#{usage => true}}};  % named buffers: docs/metering.md
ask_gas(Method, Args) -> {Method, Args}.

%% @doc The reply as the caller sees it, and the call's gas where the port
%% said it (else `undefined'): `{ok, {R, #{gas := G}}}' is `{ok, R}'; a
%% debug reply keeps its map (docs/debug.md), whose `gas' is read too.
-spec take_gas(term()) -> {term(), non_neg_integer() | undefined}.
take_gas({ok, {Result, #{gas := Gas} = Usage}}) when map_size(Usage) =:= 1, is_integer(Gas) ->
    {{ok, Result}, Gas};
take_gas({ok, {_Result, #{records := _, gas := Gas}}} = Debug) when is_integer(Gas) ->
    {Debug, Gas};
take_gas(Reply) ->
    {Reply, undefined}.

%% @doc Usage with the call's gas, when it is known.
-spec with_gas(kem:usage(), non_neg_integer() | undefined) -> kem:usage().
with_gas(Usage, undefined) -> Usage;
with_gas(Usage, Gas) -> Usage#{gas => Gas}.

%% @doc A result read from elsewhere (kem_shm's file) with the port's usage
%% map put back beside it; a failure stays as it is.
-spec beside({ok, term()} | {error, term()}, map()) -> {ok, {term(), map()}} | {error, term()}.
beside({ok, Result}, Usage) -> {ok, {Result, Usage}};
beside(Failure, _Usage) -> Failure.
