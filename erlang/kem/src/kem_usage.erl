%%% @doc The usage record of a call: what it cost, for metering
%%% (`kem:usage()': kernel, bytes in and out, time, the node that ran it).
%%% Split out of `kem' (its module would pass the 400 lines the project
%%% allows, tests/test_architecture.py); `kem' builds each record here, from
%%% a call's arguments and reply, on its one road (`checked_call') and for
%%% session calls and chains (`counted').
-module(kem_usage).

-export([none/0, of_call/4, of_input/5, reply_bytes/1, kernel_and_input/1]).

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
